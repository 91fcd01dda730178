"""The control plane: the scheduler process, its membership rules, requests and replies, and
the supervisor's client (SchedulerControl)."""
