"""The Kubernetes launch path: apply provisioned manifests, watch pods, stream logs, clean up.

Uses the `kubernetes` client, imported lazily (it is an optional dependency of the library).
"""
