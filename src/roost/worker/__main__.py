"""``python -m roost.worker``: the worker command without the top-level CLI, so a worker
can run as its own process (tests kill it by pid)."""

from roost.worker.cli import worker

if __name__ == "__main__":
    worker(prog_name="roost worker")
