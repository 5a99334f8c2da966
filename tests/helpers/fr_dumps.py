"""Flight Recorder dumps as NCCL writes them, built by hand: one entry, one rank's dump."""


def nccl_entry(record_id, pg, seq, name, state, p2p_seq=0, t=1_700_000_000.0):
    """One entry as NCCL's Flight Recorder writes it (version 2.x)."""
    return {"record_id": record_id, "pg_id": int(pg[0]), "process_group": pg,
            "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "op_id": record_id,
            "profiling_name": name, "time_created_ns": int((t + record_id) * 1e9),
            "input_sizes": [[4, 64]], "input_dtypes": ["Float"], "output_sizes": [[4, 64]],
            "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed",
            "timeout_ms": 600000, "is_p2p": "send" in name or "recv" in name,
            "frames": [{"name": "forward", "filename": "/srv/model.py", "line": 42}]}


def nccl_dump(entries, groups):
    return {"version": "2.10", "comm_lib_version": "2.21.5", "pg_status": {},
            "pg_config": {name: {"name": name, "desc": desc, "ranks": str(ranks)}
                          for name, (desc, ranks) in groups.items()},
            "entries": entries}
