"""``python -m roost.controller``: the controller command without the top-level CLI, so a
controller can run as its own process (tests kill it by pid)."""

from roost.controller.cli import controller

if __name__ == "__main__":
    controller(prog_name="roost controller")
