"""A rank's life in the cluster: joining (recovery.init), heartbeats, and each generation's
process group, with the one shim over torch's private API."""
