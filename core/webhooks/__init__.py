"""Webhook subscriptions, the outbox, its delivery and the SSRF checks on destinations."""
