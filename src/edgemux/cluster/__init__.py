"""Cluster state types and the workload description shared by estimators and simulator."""
