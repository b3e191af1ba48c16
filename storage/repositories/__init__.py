"""Repositories: take and return domain objects; table rows never leave `storage`."""
