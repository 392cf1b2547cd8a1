"""A worker waiting, after training, for the other workers to finish: bounded by --timeout
without progress (the slowest worker's clock, those finished, those dead), through the
lead server's status, while it applies the lead's hand-overs of dead or leaving workers'
rows and may be asked to join again."""
from ..ranks.bounded import Backoff, wait_all, wait_until
from ..ranks.roles import Roles
from ..run import signals
from ..worker.kvworker import KVWorker
from .shared_rows import SharedWork
from .worker_rows import Work


def wait_for_other_workers(roles: Roles, kv: KVWorker, timeout: float,
                            work: "Work | SharedWork | None" = None, hot: bool = False) -> bool:
    """Wait until every worker has finished training, however long that takes, as long as
    the slowest keeps advancing: the bound is --timeout without progress. With `work` (not a
    pipeline), workers may die or leave meanwhile: the lead server, not a barrier, says
    when, and `work` applies every hand-over the lead numbered, so that all workers share
    the test file alike; and the lead may ask this worker to join again (returns True). If
    the job stops meanwhile, the others (stopped, not finished) meet in a barrier unless
    workers may die (`hot`): this worker joins them there."""
    latest = {}
    lead = kv.lead

    def progress():
        lead.pass_on_stop(signals.stop_requested())
        latest.update(lead.status())
        return latest["slowest_clock"], latest["finished"], latest["deaths"]

    def what() -> str:
        return (f"the other workers to finish training (worker "
                f"{latest.get('slowest_worker')} is at clock {latest.get('slowest_clock')})")

    if work is None:
        wait_all([roles.group.Ibarrier()], timeout, what, progress=progress, check_every=2.0)
        return False

    def all_finished() -> bool:
        work.apply_notices(lead.notices())
        if lead.join_clock is not None:
            return True
        progress()
        return latest["finished"] == len(roles.workers) or (latest["stopping"] and not hot)
    # Each poll asks the lead; progress is judged on its latest answer.
    wait_until(all_finished, timeout, what, check_every=0.0, backoff=Backoff(longest=0.05),
               progress=lambda: (latest["slowest_clock"], latest["finished"], latest["deaths"]))
    if lead.join_clock is not None:
        return True
    if latest["stopping"] and not hot:
        return wait_for_other_workers(roles, kv, timeout)
    work.catch_up(lead, latest["deaths"], timeout)
    return False
