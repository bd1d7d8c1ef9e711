"""How trajectories and weights move between roles (docs/architecture.md §1, §6).

Modules are imported one by one, never from here, so that importing one transport (HDF5 shards,
`agentrl.transport.shards`) does not pull in another's dependencies (mpi4py for the MPI channel).
"""
