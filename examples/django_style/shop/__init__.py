"""A Django-style project without Django: settings, a DB connection helper, tasks, views."""
