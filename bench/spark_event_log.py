"""Each epoch's Spark jobs, stages and tasks, from an event log of bench/spark_streaming.py.

    PYTHONPATH=src python bench/spark_streaming.py --rows count-10k latest-10k --batches 4 \\
        --event-log /tmp/evlog
    python bench/spark_event_log.py /tmp/evlog/<app-id>   (uncompressed, one file)

Per Spark job (a native micro-batch's plan, or a slipstream epoch's DAG job): its
description, the gap since the previous job ended (time on the driver between jobs),
its wall time, and per stage the task count, the stage's wall time, and per task
(means): executor deserialize, run, result serialization, scheduler delay (launch to
finish minus those three and the result fetch), shuffle bytes read and written. Only
Spark's own event log is read (JSON lines written by this machine's Spark).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def read(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def jobs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    stages: dict[int, dict[str, Any]] = {}
    for e in events:
        kind = e.get("Event")
        if kind == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            job = out[e["Job ID"]] = {
                "id": e["Job ID"],
                "start": e["Submission Time"],
                "desc": props.get("spark.job.description")
                or props.get("spark.jobGroup.id")
                or "",
                "stages": [],
            }
            for info in e.get("Stage Infos", []):
                stage_job[info["Stage ID"]] = e["Job ID"]
                job["stages"].append(info["Stage ID"])
        elif kind == "SparkListenerJobEnd":
            out[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            st = stages.setdefault(info["Stage ID"], {"tasks": []})
            st.update(
                name=info.get("Stage Name", ""),
                submitted=info.get("Submission Time"),
                completed=info.get("Completion Time"),
                ntasks=info.get("Number of Tasks"),
            )
        elif kind == "SparkListenerTaskEnd":
            st = stages.setdefault(e["Stage ID"], {"tasks": []})
            ti, tm = e["Task Info"], e.get("Task Metrics") or {}
            dur = ti["Finish Time"] - ti["Launch Time"]
            deser = tm.get("Executor Deserialize Time", 0)
            run = tm.get("Executor Run Time", 0)
            ser = tm.get("Result Serialization Time", 0)
            fetch = (
                ti["Finish Time"] - ti["Getting Result Time"] if ti.get("Getting Result Time") else 0
            )
            sr = tm.get("Shuffle Read Metrics") or {}
            sw = tm.get("Shuffle Write Metrics") or {}
            st["tasks"].append(
                {
                    "dur": dur,
                    "deser": deser,
                    "run": run,
                    "ser": ser,
                    "delay": max(0, dur - deser - run - ser - fetch),
                    "gc": tm.get("JVM GC Time", 0),
                    "read": sr.get("Remote Bytes Read", 0) + sr.get("Local Bytes Read", 0),
                    "written": sw.get("Shuffle Bytes Written", 0),
                    "launch": ti["Launch Time"],
                }
            )
    for job in out.values():
        job["stage_info"] = [
            {"id": s, **stages[s]} for s in job["stages"] if stages.get(s, {}).get("tasks")
        ]
    return [out[k] for k in sorted(out)]


def main() -> None:
    events = read(sys.argv[1])
    prev_end = None
    for job in jobs(events):
        gap = (job["start"] - prev_end) / 1000.0 if prev_end is not None else float("nan")
        wall = (job.get("end", job["start"]) - job["start"]) / 1000.0
        prev_end = job.get("end", job["start"])
        print(f"job {job['id']} gap {gap:6.3f} s wall {wall:6.3f} s  {job['desc'][:70]}")
        for st in job["stage_info"]:
            t = st["tasks"]
            swall = ((st.get("completed") or 0) - (st.get("submitted") or 0)) / 1000.0
            print(
                f"  stage {st['id']:>4} {len(t)} tasks wall {swall:6.3f}  per task ms: "
                f"dur {_mean([x['dur'] for x in t]):6.0f} deser {_mean([x['deser'] for x in t]):4.0f} "
                f"run {_mean([x['run'] for x in t]):6.0f} delay {_mean([x['delay'] for x in t]):4.0f} "
                f"gc {_mean([x['gc'] for x in t]):3.0f}  shuffle read "
                f"{sum(x['read'] for x in t):>9,} B written {sum(x['written'] for x in t):>9,} B"
                f"  {st.get('name', '')[:40]}"
            )


if __name__ == "__main__":
    main()
