"""Playbooks: rules from a finding to an action (``[playbooks]`` in bedside.toml), the pure decision, and the
live service's automatic filing with its guardrails (docs/playbooks.md)."""
