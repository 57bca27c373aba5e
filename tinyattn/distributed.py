"""Data parallelism: one program on N processes, each with a full copy of the model and its
own slice of the batch; after backward the processes average their gradients, so every
copy takes the same step.

    mpiexec -n 2 python -m train --data input.txt         # two processes train one model

    import tinyattn.distributed as dist
    dist.init()                                          # MPI from mpiexec; a world of one without it
    dist.broadcast_parameters(model.parameters())        # everyone starts from rank 0's weights
    averager = dist.GradAverager(model.parameters())
    loss.backward()
    averager.average()                                   # p.grad: the mean over all processes
    optimizer.step()

The transport is an existing library, not one written here: MPI through mpi4py for tensors
in host memory (``pip install -e ".[dist]"`` brings mpi4py and MPICH's ``mpiexec``), and
NCCL through CuPy for CUDA tensors, with NCCL's unique id sent over MPI (as ChainerMN
did; ``init(device="cuda")`` sets it up). Any other device tensor (the "strict" test device,
or CUDA without that init) goes through a copy in host memory and MPI.

Started without an MPI launcher, or by ``mpiexec -n 1``, the world is one process: rank()
is 0, world_size() is 1, and every collective returns at once and leaves its tensor as it
is. Collectives work on a tensor's data, outside autograd, in place: the Tensor object
holds the result afterwards.
"""
import os
import sys
import time

from .backend import get_backend, use_cuda_device, uses_nccl
from .tensor import Tensor, zeros_like

# Environment variables that an MPI launcher sets in each process it starts: (size, rank)
LAUNCHERS = (("PMI_SIZE", "PMI_RANK"),                            # MPICH's and Intel MPI's mpiexec (Hydra)
             ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),    # Open MPI's mpirun
             ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"))      # MVAPICH
OPS = ("sum", "mean", "max", "min")
BUCKET_MB = 25          # PyTorch DDP's default bucket size
ABORT_GRACE_S = 0.5     # abort() waits this long after its message: MPI_Abort can kill the job before
                        # mpiexec has forwarded the last lines a process wrote

_mpi = None             # the mpi4py.MPI module, once a launcher started this process with others
_comm = None            # MPI.COMM_WORLD
_nccl = None            # an NCCL communicator for CUDA tensors (init(device="cuda"))
_started = False


def launched():
    """-> (size, rank) that an MPI launcher gave this process, from its environment; (1, 0) when none did."""
    for size_var, rank_var in LAUNCHERS:
        if size_var in os.environ:
            return int(os.environ[size_var]), int(os.environ.get(rank_var, 0))
    return 1, 0


def _start_mpi():
    """Join the MPI job that launched this process, if one did with more than one process."""
    global _mpi, _comm, _started
    if _started:
        return
    size, rank_ = launched()
    if size > 1:
        try:
            from mpi4py import MPI                      # importing it calls MPI_Init
        except ImportError:
            raise RuntimeError(f"started by an MPI launcher as rank {rank_} of {size}, but mpi4py is not "
                               "installed: pip install -e \".[dist]\"") from None
        _mpi, _comm = MPI, MPI.COMM_WORLD
    _started = True


def init(device="cpu"):
    """Join the job and return world_size(). With ``device="cuda"`` and several processes,
    also give each process the GPU of its rank on its machine and set up NCCL (call this
    before the first CUDA tensor). Calling it again does nothing more."""
    global _nccl
    _start_mpi()
    if uses_nccl(device) and world_size() > 1 and _nccl is None:
        _nccl = _start_nccl()
    return world_size()


def _start_nccl():
    """One GPU per process: the process's rank among those on its machine picks the GPU.
    Rank 0 makes NCCL's unique id and MPI carries it to the others."""
    local = _comm.Split_type(_mpi.COMM_TYPE_SHARED)          # the processes on this machine
    local_rank = local.Get_rank()
    local.Free()
    use_cuda_device(local_rank)
    nccl = get_backend("cuda").nccl()
    uid = _comm.bcast(nccl.get_unique_id() if rank() == 0 else None, root=0)
    return nccl.NcclCommunicator(world_size(), uid, rank())


def rank():
    """This process's number, 0 to world_size() - 1. Rank 0 logs and writes checkpoints."""
    _start_mpi()
    return 0 if _comm is None else _comm.Get_rank()


def world_size():
    """How many processes run the program together (1 without an MPI launcher)."""
    _start_mpi()
    return 1 if _comm is None else _comm.Get_size()


def barrier():
    """Wait until every process gets here."""
    if world_size() > 1:
        _comm.Barrier()


def abort(message, code=1):
    """Print ``message`` and end the whole job, every process, with exit status ``code``:
    the way out for one process that fails while the others wait in a collective."""
    print(message, file=sys.stderr, flush=True)
    if world_size() > 1:
        time.sleep(ABORT_GRACE_S)      # let mpiexec pass the line on before the abort tears the job down
        _comm.Abort(code)
    sys.exit(code)


# ---------------------------------------------------------------------------
# collectives on tensors
# ---------------------------------------------------------------------------
def all_reduce(tensor, op="mean"):
    """Combine ``tensor`` over all processes, in place: afterwards every process holds the
    sum, mean, max or min of everyone's values. Returns the tensor."""
    _check(tensor, "all_reduce")
    if op not in OPS:
        raise ValueError(f"all_reduce: op must be one of {', '.join(OPS)}, got {op!r}")
    if op == "mean" and tensor.dtype.kind != "f":
        raise TypeError(f"all_reduce: op='mean' needs a float tensor, got {tensor.dtype}")
    if world_size() > 1:
        tensor.data = _all_reduce_array(tensor.data, tensor.backend, op)
    return tensor


def broadcast(tensor, root=0):
    """Copy rank ``root``'s ``tensor`` into every process's ``tensor``, in place. Returns the tensor."""
    _check(tensor, "broadcast")
    if not 0 <= root < world_size():
        raise ValueError(f"broadcast: root must be a rank from 0 to {world_size() - 1}, got {root}")
    if world_size() > 1:
        tensor.data = _broadcast_array(tensor.data, tensor.backend, root)
    return tensor


def broadcast_parameters(params, root=0):
    """Give every process rank ``root``'s parameter values (at the start of training)."""
    for p in params:
        broadcast(p, root)


def _check(tensor, name):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(tensor).__name__}")


# --- on raw arrays: each returns the array that holds the result (``a`` itself where it can) ---
def _all_reduce_array(a, backend, op):
    if backend.on_host:                                  # numpy: MPI reads and writes the array itself
        buf = _contiguous(a, backend)
        _comm.Allreduce(_mpi.IN_PLACE, buf, op=_mpi_op(op))
    elif _nccl is not None and backend.has_nccl:         # CuPy: NCCL, queued on the current stream
        buf = _contiguous(a, backend)
        _nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, _nccl_type(backend, buf), _nccl_op(backend, op),
                        backend.stream_ptr())
    else:                                                # any other device: through a copy in host memory
        host = get_backend("cpu").asarray(backend.to_numpy(a))
        _comm.Allreduce(_mpi.IN_PLACE, host, op=_mpi_op(op))
        buf = backend.asarray(host)
    if op == "mean":
        if backend.ufunc_out:
            buf *= 1.0 / world_size()
        else:
            buf = buf * (1.0 / world_size())
    return buf


def _broadcast_array(a, backend, root):
    if backend.on_host:
        buf = _contiguous(a, backend)
        _comm.Bcast(buf, root=root)
    elif _nccl is not None and backend.has_nccl:
        buf = _contiguous(a, backend)
        _nccl.bcast(buf.data.ptr, buf.size, _nccl_type(backend, buf), root, backend.stream_ptr())
    else:
        host = get_backend("cpu").asarray(backend.to_numpy(a))
        _comm.Bcast(host, root=root)
        buf = backend.asarray(host)
    return buf


def _contiguous(a, backend):
    """``a`` if a collective can write into it as one block of memory, else a copy that it can."""
    if a.flags.c_contiguous and getattr(a.flags, "writeable", True):        # CuPy's flags have no writeable
        return a
    return backend.xp.array(a, copy=True, order="C")


def _mpi_op(op):
    return {"sum": _mpi.SUM, "mean": _mpi.SUM, "max": _mpi.MAX, "min": _mpi.MIN}[op]


def _nccl_op(backend, op):
    nccl = backend.nccl()
    return {"sum": nccl.NCCL_SUM, "mean": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}[op]


def _nccl_type(backend, a):
    nccl = backend.nccl()
    types = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
             "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64}
    if a.dtype.name not in types:
        raise TypeError(f"NCCL has no type for {a.dtype.name}")
    return types[a.dtype.name]


# ---------------------------------------------------------------------------
# collectives on Python objects (small things: RNG states, an error message, a summary)
# ---------------------------------------------------------------------------
def broadcast_object(obj, root=0):
    """Rank ``root``'s ``obj`` (anything picklable), returned on every process."""
    return obj if world_size() == 1 else _comm.bcast(obj, root=root)


def gather_object(obj, root=0):
    """On rank ``root``: the list of every rank's ``obj``, in rank order; None elsewhere."""
    return [obj] if world_size() == 1 else _comm.gather(obj, root=root)


def all_gather_object(obj):
    """On every process: the list of every rank's ``obj``, in rank order."""
    return [obj] if world_size() == 1 else _comm.allgather(obj)


# ---------------------------------------------------------------------------
# averaging gradients, bucketed
# ---------------------------------------------------------------------------
def buckets_of(sizes, itemsize, bucket_bytes):
    """Cut parameters (``sizes``: numbers of elements, in order) into consecutive buckets of
    about ``bucket_bytes`` each. -> a list of lists of indices. A bucket closes before the
    parameter that would take it past ``bucket_bytes``; a parameter bigger than that is a
    bucket of its own."""
    buckets, current, filled = [], [], 0
    for i, n in enumerate(sizes):
        if current and filled + n * itemsize > bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += n * itemsize
    if current:
        buckets.append(current)
    return buckets


class GradAverager:
    """Average the gradients of ``params`` over all processes, after backward.

    The gradients of consecutive parameters are packed into flat buckets of about
    ``bucket_mb`` MB, and each bucket is reduced by one collective call: a few large
    messages instead of one small one per parameter (each call has a fixed cost, its
    latency, on top of the bytes it moves). Afterwards each ``p.grad`` is a view of its
    bucket, and holds the mean over processes; a parameter without a gradient counts as
    zero there. On numpy and CuPy the buckets are made once and reused at every step
    (fresh memory would page-fault every step), so a ``p.grad`` read after the next
    ``average()`` holds that step's values. With one process, ``average()`` does nothing.
    """

    def __init__(self, params, bucket_mb=BUCKET_MB):
        self.params = list(params)
        if not self.params:
            raise ValueError("GradAverager got an empty list of parameters")
        for p in self.params:
            _check(p, "GradAverager")
        self.buckets = []                    # lists of parameters; one kind of array per bucket
        groups = []
        for p in self.params:                # split where the device or dtype changes
            if groups and groups[-1][0].backend is p.backend and groups[-1][0].dtype == p.dtype:
                groups[-1].append(p)
            else:
                groups.append([p])
        for group in groups:
            itemsize = group[0].dtype.itemsize
            for idx in buckets_of([p.numel() for p in group], itemsize, bucket_mb * 1e6):
                self.buckets.append([group[i] for i in idx])
        self.bytes_per_step = sum(p.numel() * p.dtype.itemsize for p in self.params)
        self.flats = [None] * len(self.buckets)       # each bucket's buffer, made at the first average()

    def average(self):
        """All-reduce every bucket (mean). -> the bytes of gradient reduced (0 with one process)."""
        if world_size() == 1:
            return 0
        for k, bucket in enumerate(self.buckets):
            backend = bucket[0].backend
            xp = backend.xp
            for p in bucket:
                if p.grad is None:
                    p.grad = zeros_like(p)
            flat = self._pack(k, bucket, backend)                                  # (sum of numel,)
            flat = _all_reduce_array(flat, backend, "mean")
            start = 0
            for p in bucket:
                n = p.numel()
                p.grad.data = xp.reshape(flat[start:start + n], p.shape)
                start += n
        return self.bytes_per_step

    def _pack(self, k, bucket, backend):
        """The gradients of bucket ``k`` one after another in one flat array."""
        xp = backend.xp
        grads = [xp.reshape(p.grad.data, (-1,)) for p in bucket]
        if not backend.setitem_basic:                   # a device that cannot write into slices: a new array
            return xp.concat(grads)
        if self.flats[k] is None:
            self.flats[k] = xp.empty(sum(p.numel() for p in bucket), dtype=bucket[0].data.dtype)
        flat, start = self.flats[k], 0
        for g in grads:
            flat[start:start + g.shape[0]] = g
            start += g.shape[0]
        return flat
