"""Every MPI tag mpips sends on, in one table, so that no two conversations share one.

Requests and the lead's notices go on fixed tags; a server's replies cycle through tags
from REPLY_TAG0 up (protocol.reply_tags), so that a worker matches each reply to its
request. A pipeline's micro-batches use tags 0 .. 2 * MAX_MICROS - 1 on the stage ranks'
own communicator, which carries nothing else but the stage tags below."""

REQUEST_TAG = 1       # a worker (or ctl, via the lead) to a server: one protocol message
ERROR_ACK_TAG = 2     # a server's answer to an ERROR: it has saved what it holds
NOTICE_TAG = 3        # the lead to a worker: a hand-over whose rows it shares, or a notice
DENSE_COPY_TAG = 4    # a server to one that holds a range anew: its blocks of one dense table
LOSS_TAG = 7          # full-batch: a worker's loss and gradient norm to the driver
REPLY_TAG0 = 16       # the first of the servers' reply tags

# Pipeline stage ranks (their own communicator): 2 * micro + direction for activations and
# gradients, below MAX_MICROS * 2; the stage conversation's fixed tags above that.
MAX_MICROS = 4096
STAGE_HEADER, STAGE_LABELS, STAGE_RESULT = 9001, 9002, 9003
STAGE_SCORE, STAGE_SCORE_X, STAGE_SCORE_WIDE, STAGE_SCORE_LOGITS = 9004, 9005, 9006, 9007

KEEPALIVE_TAG = 32000  # ULFM's keep-alive receive: never sent on


def micro_tag(micro: int, direction: int) -> int:
    """The tag of micro-batch `micro`'s activations (direction 0) or gradients (1)."""
    return 2 * micro + direction
