"""`convert` and `make-data`: the commands that write datasets (binary shards, synthetic
text)."""
from ..ranks.exits import exit_together, fail


def convert_parser(sub):
    p = sub.add_parser(
        "convert", help="convert text or Parquet to binary CSR shards that workers memory-map",
        description="Write OUT/ with one part of CSR arrays (.npy: labels, row pointers, uint64 "
                    "keys, float32 values) per rank and a meta.json. Under mpiexec -n K each "
                    "rank converts its own part of IN (a byte range of text, row groups of "
                    "Parquet) in parallel. `train --train OUT` "
                    "then reads it without parsing; each worker maps only its rows.")
    p.add_argument("src", metavar="IN", help="a text file (svmlight, libffm, Criteo, Avazu), a "
                   "Parquet file, or a folder of Parquet files")
    p.add_argument("dst", metavar="OUT", help="output directory")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="count and skip malformed lines instead of stopping at the first one")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.set_defaults(run=_run_convert)


def _run_convert(args) -> None:
    from mpi4py import MPI

    from ..base.errors import ConfigError, MpipsError
    from ..base.log import say, setup
    from ..data.convert import convert

    world = MPI.COMM_WORLD
    log = setup(f"rank {world.rank}")
    try:
        meta = convert(args.src, args.dst, world, skip_bad=args.skip_bad_lines,
                       overwrite=args.overwrite)
    except ConfigError as e:   # agreed by every rank: all exit, one prints
        exit_together(2, f"mpips convert: error: {e}"
                      if getattr(e, "reported", world.rank == 0) else None)
    except MpipsError as e:
        log.error("%s", e)
        world.Abort(1)
    if meta:
        say(f"wrote {args.dst}: {meta['rows']:,} rows, {meta['nnz']:,} non-zeros in "
            f"{len(meta['parts'])} part(s), about {meta['distinct_keys']:,} distinct keys" +
            (f"; skipped {meta['bad_lines']:,} bad line(s)" if meta["bad_lines"] else ""))


def make_data_parser(sub):
    p = sub.add_parser(
        "make-data", help="write a synthetic dataset (svmlight train/test files)",
        description="Write PREFIX.train.svm and PREFIX.test.svm, with labels drawn from a "
                    "planted logistic model. --kind ctr (default): hashed 64-bit categorical "
                    "features with Zipf-skewed frequencies and two numeric features. census: "
                    "like the adult/a9a data, 14 correlated categorical fields one-hot encoded "
                    "into 123 binary features. dense: 10 real-valued features of different "
                    "magnitudes. Same arguments, same files.")
    p.add_argument("prefix", metavar="OUT_PREFIX", help="e.g. data/ctr -> data/ctr.train.svm")
    p.add_argument("--rows", type=int, required=True, help="training rows")
    p.add_argument("--test-rows", type=int, help="test rows (default: rows / 5)")
    p.add_argument("--kind", choices=("ctr", "census", "dense"), default="ctr",
                   help="what the data looks like (default: %(default)s)")
    p.add_argument("--features", type=int,
                   help="distinct categorical values over all fields (ctr only; default: 1048576)")
    p.add_argument("--nnz", type=int, help="features per row (ctr only; default: 20)")
    p.add_argument("--format", choices=("svmlight", "libffm", "criteo"), default="svmlight",
                   help="svmlight (PREFIX.train.svm); libffm (PREFIX.train.ffm: the same rows, "
                        "each feature as field:value:x, for Wide & Deep's --fields); criteo: "
                        "the Criteo display-advertising layout (PREFIX.train.tsv: label, 13 "
                        "integer and 26 hexadecimal categorical fields, tab separated, some "
                        "empty), labels from a planted model over the keys mpips makes of them "
                        "(default: svmlight)")
    p.add_argument("--interactions", type=int, default=0, metavar="R",
                   help="ctr only: each key also gets a planted latent vector of R values, and "
                        "each pair of a row's features adds their dot product to the margin, "
                        "as large as the linear part: data on which a factorization machine "
                        "(--model fm) beats logistic regression (default: 0, none)")
    p.add_argument("--seed", type=int, default=1, help="(default: %(default)s)")
    p.set_defaults(run=_run_make_data)


def _run_make_data(args) -> None:
    from ..base.errors import ConfigError, SaveError
    from ..base.log import say
    from ..data.synthetic import make_data
    try:
        files = make_data(args.prefix, args.rows, args.features, args.nnz, args.seed,
                          args.test_rows, args.kind, args.interactions, args.format)
    except ConfigError as e:
        fail(str(e), 2)
    except MemoryError as e:
        fail(f"--rows {args.rows:,} with these options needs more memory than this machine "
             f"gives ({e}): make fewer rows, or fewer features per row", 2)
    except SaveError as e:   # "cannot write PATH: why"
        fail(str(e), 1)
    for f in files.values():
        say(f"wrote {f['path']}: {f['rows']:,} rows, {f['positive_rate']:.1%} positive")
