"""Limits of Amazon SQS FIFO queues, checked before talking to any broker (the embedded
one enforces them too, so code does not start failing when it moves to SQS).
"""

from __future__ import annotations

import re

#: Most messages one ReceiveMessage, SendMessageBatch or DeleteMessageBatch handles.
MAX_BATCH_ENTRIES = 10
#: Largest message body on current queues (older queues: 256 KiB; read the queue).
MAX_MESSAGE_BYTES = 1024 * 1024
#: Smallest value SQS accepts for a queue's MaximumMessageSize.
MIN_MESSAGE_BYTES = 1024
#: Largest total payload of one SendMessageBatch.
MAX_BATCH_BYTES = 1024 * 1024
#: Longest a message can stay invisible, counted from its receive (12 hours).
MAX_VISIBILITY_SECONDS = 12 * 60 * 60
#: Longest SQS keeps a message (14 days; default 4): every queue shardq creates gets it.
MAX_RETENTION_SECONDS = 14 * 24 * 60 * 60
#: Shortest retention a queue can be given (1 minute).
MIN_RETENTION_SECONDS = 60
#: Longest a long poll can wait.
MAX_WAIT_SECONDS = 20
#: How long SQS remembers a MessageDeduplicationId.
DEDUP_WINDOW_SECONDS = 5 * 60
#: Longest MessageGroupId.
MAX_GROUP_ID_LENGTH = 128
#: Longest queue name, ``.fifo`` suffix included.
MAX_QUEUE_NAME_LENGTH = 80
FIFO_SUFFIX = ".fifo"

#: MessageGroupId and MessageDeduplicationId: letters, digits and ASCII punctuation.
GROUP_ID_PATTERN = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
#: A character SQS refuses in a message body (it takes tab, newline, carriage return and
#: Unicode from U+0020 but surrogates, U+FFFE and U+FFFF). A body ``str.isprintable()``
#: holds none (each is a control, a surrogate or a noncharacter): checked first, cheaper.
BODY_REFUSED = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
#: Queue names: letters, digits, hyphens and underscores.
QUEUE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
#: An AWS region's form, such as us-east-1 (botocore's: a host label, not all digits;
#: "" is no region).
REGION_PATTERN = re.compile(r"(?![0-9]+$)(?!-)[a-zA-Z0-9-]{0,63}(?<!-)")

#: Most threads one node runs (beyond, it spends its time switching and is slow to stop).
MAX_THREADS = 256
#: Most jobs one node runs at once (``concurrency``).
MAX_CONCURRENCY = 1000
