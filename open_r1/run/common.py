"""What the run-safety callbacks share: rank checks, cross-rank agreement."""


def _world_size() -> int:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:  # noqa: BLE001
        return 1


def _reduce_max(values: list[float], args=None) -> list[float]:
    """Element-wise max over ranks (any rank that wants to stop stops every rank). Single process: identity.
    Called at the same hook on every rank, so the collective always matches up."""
    if _world_size() == 1:
        return list(values)
    import torch
    import torch.distributed as dist

    # a settings read with a default: callers outside a Trainer (the budget's tests) pass no TrainingArguments
    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def _is_rank0(state) -> bool:
    return bool(getattr(state, "is_world_process_zero", True))
