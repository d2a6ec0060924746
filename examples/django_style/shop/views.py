"""Views: they publish a job and answer at once instead of doing the work inline."""

from __future__ import annotations

from shop.tasks import UpdateOrderStatus


def order_status_changed(order_id: int, status: str, customer: str) -> str:
    """What ``POST /orders/<id>/status`` would do; returns the job's message id."""
    return UpdateOrderStatus.publish(f"order-{order_id}", {"status": status, "customer": customer})
