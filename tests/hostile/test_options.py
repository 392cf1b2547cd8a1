"""Options a careless user gives: refused at once, on every launch, with one message that
names the option; never a job that runs into NaN or a message that is sometimes lost.

To add a case: append (arguments, what the message must say) to REFUSED; each is checked
in one process, and a few of each kind are launched under mpiexec too (LAUNCHED).
"""
import re

import pytest
from support import run_job

from mpips.run.config_checks import check

REFUSED = [
    (("--lr", "inf"), "argument --lr: 'inf': give a finite number"),
    (("--l2", "inf"), "argument --l2: 'inf': give a finite number"),
    (("--lr", "nan"), "argument --lr: 'nan': give a finite number"),
    (("--timeout", "nan"), "argument --timeout: 'nan': give a finite number"),
    (("--checkpoint-every", "nans"), "'nans': must be a finite number, not negative"),
    (("--checkpoint-every", "-3"), "'-3': must be a finite number, not negative"),
    (("--straggler", "0:inf"), "expected W:FACTOR such as 0:3, or W:FACTOR:CLOCKS such as "
                                 "0:3:50, got '0:inf'"),
    (("--straggler", "0:3:0"), "slowed for 0 clocks in every 0: give 1 or more"),
    (("--optimizer", "rmsprop"), "argument --optimizer: invalid choice: 'rmsprop'"),
    (("--balance", "fast"), "argument --balance: invalid choice: 'fast'"),
    (("--disk-wait", "-1"), "--disk-wait must be a number of seconds >= 0, got -1.0"),
    (("--allow-changed-data",), "--allow-changed-data applies to --resume only"),
    (("--lr", "-0.1"), "--lr must be positive, got -0.1"),
    (("--replicas", "0"), "--replicas 0: each key is kept on that many servers, so it must be "
                          "from 1 to --servers (1)"),
    (("--servers", "2", "--replicas", "3"), "--replicas 3: each key is kept on that many "
                                            "servers, so it must be from 1 to --servers (2)"),
    (("--average-after", "1"), "--average-after needs --optimizer sgd (got --optimizer "
                               "adagrad)"),
    (("--optimizer", "sgd", "--average-after", "-2"),
     "argument --average-after: '-2': give epochs >= 0, or off"),
    (("--optimizer", "sgd", "--average-after", "never"),
     "argument --average-after: 'never' is not a number"),
    (("--l1", "0.1"), "--l1 needs --optimizer ftrl or --solver lbfgs (got --optimizer adagrad)"),
    (("--solver", "newton"), "argument --solver: invalid choice: 'newton'"),
    (("--solver", "lbfgs", "--consistency", "asp"), "--solver lbfgs does not take "
                                                    "--consistency asp"),
    (("--solver", "lbfgs", "--epochs", "3"), "--solver lbfgs does not take --epochs 3"),
    (("--solver", "lbfgs", "--dim", "0"), "--dim must be from 1 to 1099511627775, got 0"),
    (("--solver", "lbfgs", "--history", "0"), "--history must be from 1 to 1000, got 0"),
    (("--solver", "lbfgs", "--tol", "-1"), "--tol must be from 0 to 1, got -1.0"),
    (("--max-rank-memory", "lots"), "argument --max-rank-memory: 'lots' is not a size such "
                                    "as 512M or 2G"),
    (("--max-rank-memory", "100K"), "--max-rank-memory must be at least 1M, got 102400 bytes"),
    (("--model", "fm", "--factors", "0"), "--factors must be from 1 to 1024, got 0"),
    (("--model", "svm"), "argument --model: invalid choice: 'svm'"),
    (("--model", "widedeep", "--hidden", "64,x"), "argument --hidden: '64,x' is not layer "
                                                  "widths such as 64,32"),
    (("--model", "widedeep", "--embedding-dim", "0"), "--embedding-dim must be from 1 to 1024"),
    (("--model", "widedeep", "--hidden", "64,0"), "--hidden must be layer widths from 1 to "
                                                  "4096, got 64,0"),
    (("--format", "criteo"), "--format criteo, but its first line is svmlight text"),
    (("--format", "avazu"), "--format avazu, but its first line is svmlight text"),
    (("--solver", "lbfgs", "--model", "fm"), "--solver lbfgs does not take --model fm "
                                             "(full batch trains lr)"),
    (("--stages", "3"), "--stages 3 splits Wide & Deep's network across workers: it needs "
                        "--model widedeep (got --model lr)"),
    (("--model", "widedeep", "--stages", "2"), "--stages 2 needs whole pipelines: the job has "
                                               "3 worker(s), not a multiple of 2; launch 3 "
                                               "ranks"),
    (("--model", "widedeep", "--hidden", "64", "--stages", "3"),
     "--stages 3: the network has 2 layers (--hidden 64 and the output), and each stage "
     "needs one"),
    (("--model", "widedeep", "--stages", "0"), "--stages must be at least 1, got 0"),
    (("--model", "widedeep", "--stages", "3", "--micro-batches", "0"),
     "--micro-batches must be from 1 to 4096, got 0"),
    (("--pipeline", "zigzag"), "argument --pipeline: invalid choice: 'zigzag'"),
    (("--fields", "5"), "--fields 5 is the number of fields Wide & Deep concatenates: it "
                        "needs --model widedeep (got --model lr)"),
    (("--model", "widedeep", "--fields", "5"), "svmlight text, whose features carry no field"),
    (("--model", "widedeep", "--fields", "255"), "--fields must be from 0 (sum the "
                                                 "embeddings) to 254, got 255"),
    (("--format", "libffm"), "--format libffm, but its first line is svmlight text"),
    (("--spares", "-1"), "--spares must be 0 or more, got -1"),
    (("--servers", "2", "--replicas", "2", "--spares", "2"),
     "--servers 2 and --spares 2 leave no worker: the job has 4 rank(s)"),
    (("--vnodes", "0"), "--vnodes must be from 1 to 4096 key ranges per server, got 0"),
    (("--push-threshold", "-0.1"), "--push-threshold must be a gradient magnitude >= 0, got "
                                   "-0.1"),
    (("--push-threshold", "nan"), "argument --push-threshold: 'nan': give a finite number"),
    (("--push-values", "int4"), "argument --push-values: invalid choice: 'int4'"),
    (("--push-skip-zeros",), "--push-skip-zeros holds back gradients of weights FTRL's --l1 "
                             "keeps at 0: it needs --optimizer ftrl and --l1 > 0 (got "
                             "--optimizer adagrad --l1 0)"),
    (("--optimizer", "ftrl", "--push-skip-zeros"), "(got --optimizer ftrl --l1 0)"),
    (("--solver", "lbfgs", "--push-values", "int8"),
     "--push-values, --push-threshold and --push-skip-zeros filter the minibatch solver's "
     "pushes; --solver lbfgs pushes none"),
    (("--model", "widedeep", "--servers", "2", "--stages", "2", "--push-threshold", "0.01"),
     "with --stages 2 the later stages push the network's layers, whose held-back rows no "
     "last push would deliver"),
]


# Each kind of refusal (the parser's, the configuration's, the data's, a layout's) also
# launched under mpiexec: every rank stops, the message is said once, nothing is written.
LAUNCHED = [case for case in REFUSED if " ".join(case[0]) in (
    "--lr inf", "--replicas 0", "--format criteo", "--model widedeep --stages 2",
    "--max-rank-memory lots", "--solver lbfgs --consistency asp")]


def refusal(argv: list, capsys) -> str:
    """What `mpips train ARGV` says, in this process, when it refuses before any work: the
    parser's message, or the configuration's check as every rank runs it (4 ranks)."""
    from mpips.cli import main as cli
    from mpips.base.errors import ConfigError
    try:
        args = cli.build_parser().parse_args(["train", *map(str, argv)])
        check(cli.config_of(args), 4)
    except SystemExit:
        return capsys.readouterr().err
    except ConfigError as e:
        return str(e)
    return "(accepted)"


@pytest.mark.parametrize("args, says", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_bad_option_is_refused_naming_it(small_data, tmp_path, capsys, args, says):
    said = refusal(["--train", small_data[0], "--out", tmp_path / "run", *args], capsys)
    assert says in said
    assert not (tmp_path / "run").exists()


def test_a_bad_mpips_fsync_in_the_environment_is_refused_naming_it(small_data, tmp_path):
    """Read as mpips is imported: a launch with it set is refused before any work."""
    job = run_job(2, "train", "--train", small_data[0], "--out", tmp_path / "run",
                  env={"MPIPS_FSYNC": "off"}, timeout=60)
    assert job.returncode == 2, job.output
    assert "MPIPS_FSYNC='off' in the environment: set it to 1" in job.output
    assert "Traceback" not in job.output
    assert not (tmp_path / "run").exists(), "refused before anything was written"


@pytest.fixture(scope="module")
def launched(small_data, tmp_path_factory) -> dict:
    """Each LAUNCHED case run once under mpiexec (4 ranks): its arguments -> (the job, its
    --out)."""
    jobs = {}
    for args, _ in LAUNCHED:
        run = tmp_path_factory.mktemp("refused") / "run"
        jobs[args] = (run_job(4, "train", "--train", small_data[0], "--out", run, *args,
                              timeout=60), run)
    return jobs


@pytest.mark.parametrize("args, says", LAUNCHED, ids=[" ".join(a) for a, _ in LAUNCHED])
def test_a_bad_option_is_refused_with_one_message(launched, args, says):
    job, run = launched[args]
    assert job.returncode == 2, job.output
    assert says in job.stderr
    assert job.stderr.count("error:") == 1, "said once, not once per rank"
    assert not run.exists(), "nothing written for a refused job"


# Launches of a refusal, in all: LAUNCHED's, then as many more of one option as it takes.
NEVER_LOST_LAUNCHES = 8


def test_the_message_is_never_lost_when_every_rank_exits_at_once(small_data, launched):
    """The launcher kills the other ranks when one exits with an error: rank 0 must have
    printed before any rank exits (it used to be lost about one launch in six). Every rank
    exits at once in each launched refusal: LAUNCHED's (one of each kind) and more of
    --checkpoint-every -3, 8 launches in all, each says its message."""
    for args, says in LAUNCHED:
        assert says in launched[args][0].stderr, f"launch of {' '.join(args)}"
    for attempt in range(NEVER_LOST_LAUNCHES - len(LAUNCHED)):
        job = run_job(4, "train", "--train", small_data[0], "--checkpoint-every", "-3",
                      timeout=60)
        assert "must be a finite number, not negative" in job.stderr, f"launch {attempt}"


def test_a_model_past_the_memory_limit_stops_the_job_naming_the_table(small_data, tmp_path):
    job = run_job(3, "train", "--train", small_data[0], "--out", tmp_path / "run",
                  "--servers", 2, "--solver", "lbfgs", "--dim", 1 << 22,
                  "--max-rank-memory", "100M", timeout=120)
    assert job.returncode != 0
    assert "needs 16.0 MiB" in job.output and "--max-rank-memory 100.0 MiB would be " \
                                               "exceeded" in job.output, job.output
    # Each line names the server the error is from once: the failing server's own line in
    # its prefix alone (its text once began "server 0: " too), a relay after "stopping:".
    said = [line.split("ERROR ", 1)[1] for line in job.output.splitlines()
            if "would be exceeded" in line]
    assert said, job.output
    for text in said:
        relayed = text.removeprefix("stopping: ")
        assert relayed.startswith("table ") if relayed == text else \
            re.match(r"server \d: table ", relayed) and relayed.count("server ") == 1, said
