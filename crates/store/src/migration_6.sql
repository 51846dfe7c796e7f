-- afkit project schema, version 6.
-- How many submissions each annotation task has, kept by triggers so that every way a submission
-- comes or goes (the terminal UI, a crowd import, an undo) keeps it true. Handing out the next
-- item then reads only the tasks that still want a submission, through a partial index, instead
-- of counting the submissions of every finished task before it on every claim.
ALTER TABLE tasks ADD COLUMN submitted INTEGER NOT NULL DEFAULT 0;
UPDATE tasks SET submitted = (SELECT COUNT(*) FROM submissions s WHERE s.task_id = tasks.id);
CREATE TRIGGER submissions_counted AFTER INSERT ON submissions BEGIN
    UPDATE tasks SET submitted = submitted + 1 WHERE id = NEW.task_id;
END;
CREATE TRIGGER submissions_uncounted AFTER DELETE ON submissions BEGIN
    UPDATE tasks SET submitted = submitted - 1 WHERE id = OLD.task_id;
END;
CREATE INDEX tasks_wanting ON tasks(status, id) WHERE submitted < replicas;
