"""The auditor's page: read-only HTML views over the audit logs (one per replica) and the limits store.

:func:`create_audit_app` builds the Starlette app ``plugin-llm audit serve`` serves and
``plugin-llm serve`` mounts under ``/audit`` (admin token only). Starlette is imported only here.
"""
