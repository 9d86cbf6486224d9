"""The post-mortem report of one run (``bedside report``): read once from the store, read-only (``reading``), told
as sections of plain blocks (``story``, ``timeline``), written as one self-contained HTML page (``page``) or as a
Markdown ticket (``ticket``)."""
