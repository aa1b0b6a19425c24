"""A pool's own scale-down stabilization window, in seconds (HPA's
``behavior.scaleDown.stabilizationWindowSeconds``, within the same 0..3600). NULL, the
default, keeps the controller's window (`PlanSettings.scale_down_window`, lengthened for a
small pool). Adding a nullable column with no default rewrites nothing.
"""

SQL = """
ALTER TABLE worker_pools
    ADD COLUMN scale_down_window integer
        CHECK (scale_down_window BETWEEN 0 AND 3600);
"""
