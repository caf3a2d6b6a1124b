"""shardopt: a distributed optimizer service (see README.md).

This package wraps the C++ trainer client:

* ``shardopt.Client``: one trainer of one model, speaking to the shard
  servers (register or attach, step, pull, checkpoint, inspect) with flat
  float32 buffers that cross into C++ without copies;
* ``shardopt.torch.DistributedOptimizer``: a ``torch.optim.Optimizer`` whose
  ``step()`` pushes the gradients to the shard servers and pulls the updated
  parameters into the parameters' own storage.

Errors from the C++ side are ``ShardoptError`` (a ``RuntimeError``) or one of
its subclasses named after the gRPC status code; ``InvalidArgumentError`` is
also a ``ValueError``, ``UnavailableError`` a ``ConnectionError``,
``DeadlineExceededError`` a ``TimeoutError``, ``NotFoundError`` a
``LookupError``. Each carries the code's name in ``.code``.
"""

try:  # Installed next to this file, or (from a Bazel tree) on sys.path.
    from . import _shardopt
except ImportError:  # pragma: no cover - depends on the layout
    import _shardopt

Client = _shardopt.Client
ShardoptError = _shardopt.ShardoptError
InvalidArgumentError = _shardopt.InvalidArgumentError
NotFoundError = _shardopt.NotFoundError
AlreadyExistsError = _shardopt.AlreadyExistsError
FailedPreconditionError = _shardopt.FailedPreconditionError
OutOfRangeError = _shardopt.OutOfRangeError
UnavailableError = _shardopt.UnavailableError
DeadlineExceededError = _shardopt.DeadlineExceededError
ResourceExhaustedError = _shardopt.ResourceExhaustedError
AbortedError = _shardopt.AbortedError
CancelledError = _shardopt.CancelledError
DataLossError = _shardopt.DataLossError
InternalError = _shardopt.InternalError
UnimplementedError = _shardopt.UnimplementedError
UnauthenticatedError = _shardopt.UnauthenticatedError
PermissionDeniedError = _shardopt.PermissionDeniedError

__all__ = [name for name in dir() if not name.startswith("_")]
