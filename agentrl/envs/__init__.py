"""Environments: the Task API and its wire types (`api`), the gateway client the rollout uses
(`client`), the env worker server (`worker`) and the built-in tasks (`tasks`).

Importing this package imports nothing else and starts nothing: pick the submodule you need.
"""
