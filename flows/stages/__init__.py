"""Pipeline stages as plain functions: each wires `futureworld` logic to `storage`.

The CLI and the Prefect flows call these; tests call them directly.
"""
