"""Tell a listening controller that tasks arrived, so an idle pool (no replica) wakes at
once instead of on the next tick. One NOTIFY per statement and pool (a transition
table), never one per row: a bulk insert costs one message per pool."""

SQL = """
CREATE FUNCTION roost_notify_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p text;
BEGIN
    FOR p IN SELECT DISTINCT pool_id FROM new_tasks LOOP
        PERFORM pg_notify('roost_tasks', p);
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER tasks_notify AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION roost_notify_tasks();
"""
