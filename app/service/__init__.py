"""bedside's service: the one composition of follow -> ingest -> detect -> persist -> route -> deliver.

``owner.RunOwner`` is used by ``serve``, ``watch``, ``collect --follow`` and ``demo``; the store <-> detectors
feed and sink, alert routing, payloads, rendering, delivery and senders live here, and the tables they own
(findings, incidents, the outbox) are the ``service`` schema next to them (``schema/``).
"""
