"""Bench job: a trivial worker that only waits to be killed."""

import time

time.sleep(3600)
