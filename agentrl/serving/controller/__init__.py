"""The env controller: registry of env workers, session routing, timeouts, and the session routes the rollout calls.

`server.start_controller(cfg)` / `server.create_controller_app(cfg)` build it; `registry` holds its
state and routing rule. Importing this package starts nothing.
"""
