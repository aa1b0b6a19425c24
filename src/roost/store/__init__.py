"""Postgres: schema, migrations and queries."""
