"""Alerts to chat: notifier configuration, routing incidents into a durable outbox, and delivery.

The router decides, in the detection thread, which incident changes become messages
(one per incident, follow-ups only when severity rises, a resolve message, digests
when flooded) and writes them to the store's outbox in the same transaction as the
incident change. The sender delivers the outbox from its own threads, one per
notifier, with timeouts, retries and backoff, so that nothing here waits on the
network in the collector's or the trainer's path. See docs/alerts.md.
"""
