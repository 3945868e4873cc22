"""Who may do what: projects, API keys, roles and scopes, members and service accounts, OIDC tokens,
the audit log."""
