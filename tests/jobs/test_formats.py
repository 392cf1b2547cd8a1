"""Criteo, Avazu and libffm input as whole jobs: make-data writes Criteo's layout, convert
takes it in parallel, a job trains on it (text or converted) to a model that has learned the
planted one; a job trains on Avazu's CSV; Wide & Deep concatenates the fields each format
gives (Criteo's 39 known, libffm's counted when converting, --fields on text)."""
import numpy as np
from support import read_summary, refusal, run_here, run_job, run_mpips, same_model

from mpips.models.evaluate import read_rows
from mpips.storage.model_files import load_model
from mpips.data.inputs import read_meta


def test_a_job_learns_from_criteo_text_and_its_conversion_alike(criteo, tmp_path):
    converted = tmp_path / "train.bin"
    job = run_job(3, "convert", criteo[0], converted)
    assert job.returncode == 0, job.output
    text = read_rows(criteo[0])
    binary = read_rows(converted)
    for field in ("labels", "indptr", "indices", "values"):
        np.testing.assert_array_equal(getattr(binary, field), getattr(text, field))
    assert read_meta(converted)["fields"] == 39
    models = []
    for name, source in (("text", criteo[0]), ("binary", converted)):
        run = tmp_path / name
        job = run_job(2, "train", "--train", source, "--test", criteo[1], "--format", "criteo",
                      "--out", run, "--epochs", 3, "--lr", 0.06)   # (a text sample's estimate
        # of the features per row would set a rate a little apart from the exact count's)
        assert job.returncode == 0, job.output
        models.append(load_model(run / "model"))
    np.testing.assert_array_equal(models[0][1], models[1][1])   # one worker, same rows
    s = read_summary(tmp_path / "text")
    base = np.mean(read_rows(criteo[1]).labels)
    entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    print(f"criteo-format test logloss {s['test_logloss']:.4f}, base rate {entropy:.4f}")
    assert s["test_logloss"] < 0.9 * entropy and s["test_auc"] > 0.7


def avazu_file(path, rows: int, seed: int) -> None:
    """Lines in Avazu's layout (header, id, click, hour, 21 columns), clicks more likely for
    some sites and hours, written here (no download)."""
    world = np.random.default_rng(0)   # the same sites and their lift in every file
    sites = [f"{v:08x}" for v in world.integers(0, 2**32, 40)]
    lift = world.normal(0, 1.2, 40)
    pool = [f"{v:08x}" for v in world.integers(0, 2**32, 500)]   # ids, domains, devices
    rng = np.random.default_rng(seed)
    lines = ["id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,"
             "app_domain,app_category,device_id,device_ip,device_model,device_type,"
             "device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21"]
    for r in range(rows):
        site, hour = int(rng.integers(40)), int(rng.integers(24))
        p = 1 / (1 + np.exp(-(-1.5 + lift[site] + (0.8 if 18 <= hour <= 22 else 0))))
        cols = [str(rng.integers(1001, 1011)), str(rng.integers(0, 3)), sites[site],
                *[pool[v] for v in rng.integers(0, len(pool), 8)],
                *[str(v) for v in rng.integers(0, 5, 2)],
                *[str(v) for v in rng.integers(0, 300, 8)]]
        lines.append(f"{rng.integers(2**63)},{int(rng.random() < p)},"
                     f"1410{rng.integers(21, 31)}{hour:02d},{','.join(cols)}")
    path.write_text("\n".join(lines) + "\n")


def test_a_job_learns_from_avazu_csv(tmp_path):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    avazu_file(train, 20000, 1)
    avazu_file(test, 5000, 2)
    job = run_job(3, "train", "--train", train, "--test", test, "--format", "avazu",
                  "--out", tmp_path / "run", "--epochs", 2)
    assert job.returncode == 0, job.output
    s = read_summary(tmp_path / "run")
    base = np.mean(read_rows(str(test)).labels)
    entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    print(f"avazu-format test logloss {s['test_logloss']:.4f}, base rate {entropy:.4f}")
    assert s["train_examples"] == 2 * 20000 and s["test_logloss"] < 0.9 * entropy
    converted = tmp_path / "train.bin"
    job = run_job(3, "convert", train, converted)
    assert job.returncode == 0, job.output
    text, binary = read_rows(str(train)), read_rows(converted)
    assert len(text) == 20000 and text.indptr[-1] == 20000 * 23
    assert read_meta(converted)["fields"] == 23
    for field in ("labels", "indptr", "indices", "values"):
        np.testing.assert_array_equal(getattr(binary, field), getattr(text, field))


def test_wide_and_deep_concatenates_the_fields_of_criteo_and_libffm(criteo, tmp_path):
    net = ("--model", "widedeep", "--embedding-dim", 2, "--hidden", 8)
    job = run_job(2, "train", "--train", criteo[0], "--out", tmp_path / "c", *net)
    assert job.returncode == 0, job.output
    assert "network reads the 39 fields' embeddings concatenated" in job.output
    assert read_summary(tmp_path / "c")["config"]["fields"] == 39
    job = run_mpips("train", "--train", criteo[0], *net, "--print-schedule")
    assert job.returncode == 0 and "concatenate 39 fields (78)" in job.output, job.output
    # Too few fields for Criteo's: the configuration's check (as each rank of a 2-rank job
    # makes it), in this process; a libffm feature past --fields, which a worker finds as it
    # reads, is launched below.
    status, said = refusal(["--train", criteo[0], "--out", tmp_path / "few", *net,
                            "--fields", 10], 2)
    assert status == 2, said
    assert "--fields 10: --train" in said and "has 39 fields (give --fields 39" in said
    prefix = tmp_path / "f"
    job = run_mpips("make-data", "--format", "libffm", "--rows", 3000, "--nnz", 5,
                    "--features", 200, prefix)
    assert job.returncode == 0, job.output
    job = run_job(2, "convert", f"{prefix}.train.ffm", tmp_path / "f.bin")
    assert job.returncode == 0, job.output
    assert read_meta(tmp_path / "f.bin")["fields"] == 5, "libffm's largest field + 1"
    job = run_job(2, "train", "--train", f"{prefix}.train.ffm", "--out", tmp_path / "f4",
                  *net, "--fields", 4)
    assert job.returncode != 0 and "a feature in field 4" in job.output
    assert "give --fields 5 or more" in job.output


def parquet_table(rows: int, seed: int):
    """Rows of a click log as Parquet columns of each kind the reader maps: a site (string),
    an hour (integer), a price (floating), tags (list<int32>), bids (map<int32, float32>);
    clicks from a planted model over them."""
    import pyarrow as pa
    world = np.random.default_rng(0)
    site_lift, tag_lift = world.normal(0, 1.2, 40), world.normal(0, 0.8, 20)
    rng = np.random.default_rng(seed)
    site, hour = rng.integers(0, 40, rows), rng.integers(0, 24, rows)
    price = rng.random(rows)
    counts = rng.integers(0, 4, rows)
    tags = rng.integers(0, 20, counts.sum())
    at = np.concatenate([[0], np.cumsum(counts)])
    margin = (-1.0 + site_lift[site] + 0.8 * ((18 <= hour) & (hour <= 22)) + price
              + np.add.reduceat(np.append(tag_lift[tags], 0), at[:-1]) * (counts > 0))
    label = (rng.random(rows) < 1 / (1 + np.exp(-margin))).astype(np.int8)
    bids = pa.MapArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32)),
                                   pa.array(rng.integers(0, 10, rows).astype(np.int32)),
                                   pa.array(rng.random(rows).astype(np.float32)))
    return pa.table({"label": label, "site": [f"site-{s}" for s in site],
                     "hour": hour.astype(np.int8), "price": price,
                     "tags": pa.ListArray.from_arrays(pa.array(at.astype(np.int32)),
                                                      pa.array(tags.astype(np.int32))),
                     "bids": bids})


def test_a_job_trains_on_a_parquet_folder_as_on_its_conversion(tmp_path):
    """2 workers, each its two row groups of a folder of two files; held-out Parquet; the
    folder converted to shards trains the same model, bit for bit (BSP)."""
    import pyarrow.parquet as pq
    folder = tmp_path / "train"
    folder.mkdir()
    for f in range(2):
        pq.write_table(parquet_table(2000, 1 + f), folder / f"part-{f}.parquet",
                       row_group_size=1000)
    test = tmp_path / "test.parquet"
    pq.write_table(parquet_table(1000, 9), test)
    converted = tmp_path / "train.bin"
    job = run_job(2, "convert", folder, converted)
    assert job.returncode == 0, job.output
    ours, theirs = read_rows(str(folder)), read_rows(converted)
    for field in ("labels", "indptr", "indices", "values"):
        np.testing.assert_array_equal(getattr(theirs, field), getattr(ours, field))
    assert read_meta(converted)["fields"] == 5
    assert read_meta(converted)["text_format"] == "parquet"
    runs = []
    for name, source in (("parquet", folder), ("shards", converted)):
        runs.append(tmp_path / name)
        job = run_job(3, "train", "--train", source, "--test", test, "--out", runs[-1],
                      "--epochs", 2, "--lr", 0.1, "--batch-size", 20)
        assert job.returncode == 0, job.output
    same_model(*runs)
    s = read_summary(runs[0])
    base = np.mean(read_rows(str(test)).labels)
    entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    print(f"parquet test logloss {s['test_logloss']:.4f}, base rate {entropy:.4f}")
    assert s["train_examples"] == 2 * 4000 and s["test_examples"] == 1000
    assert s["test_logloss"] < 0.95 * entropy and s["test_auc"] > 0.7
    scored = run_here("score", runs[0], "--test", test)
    assert scored.returncode == 0 and f"logloss {s['test_logloss']:.4f}" in scored.stdout, \
        scored.output
    text = tmp_path / "t.svm"
    text.write_text("1 1:1\n")
    scored = run_here("score", runs[0], "--test", text)
    assert scored.returncode == 2 and "trained on parquet data" in scored.stderr, scored.output
