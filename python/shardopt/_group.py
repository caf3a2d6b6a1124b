"""shardopt.torch's parameter groups: each one's shardopt model, flat
buffers and, with overlap_backward, the buckets its gradient streams in."""

import weakref

import torch

from . import FailedPreconditionError


class Group:
    """One parameter group: its shardopt model and flat buffers."""

    def __init__(self, index, client, model_id, params, names):
        self.index = index       # In param_groups.
        self.client = client
        self.model_id = model_id
        self.params = params
        self.names = names
        self.flat_params = None
        self.flat_grads = None
        self.slices = []  # (offset, size) of each parameter in the flat buffers
        self.sent_hyperparameters = None
        self.sent_for_step = None  # The step sent_hyperparameters take effect at, if sent.
        self.version = 0         # The last version pulled.
        self.last_result = None
        self.pulled = None       # With check_parameters: the values last pulled.
        self.frozen = []         # The group's parameters left out (requires_grad=False).
        # Streaming (overlap_backward): buckets of the flat buffer, and for
        # the step being computed which parameters' gradients are final.
        self.bucket_of = []      # Parameter index -> bucket.
        self.buckets = []        # (begin, end) per bucket, covering the buffer.
        self.accumulators = []   # Autograd's gradient accumulators (kept alive).
        self.changed_in_a_row = 0  # Streamed steps whose gradient changed after sending.
        self.outside_in_a_row = 0  # Steps whose backward made gradients outside the buffer.
        self.resume_pending = False  # A rollback's pull failed: pull first.
        self.no_stream = False   # Never streamed (LAMB on the flat partition).
        # The flat buffers live in the device pairs' memory (a GPU's for
        # NCCL, the host's for the loopback stand-in): steps go through
        # step_on_device.
        self.device_buffers = False
        self.reset_stream()

    def gather(self, views, name_of_frozen):
        """Before a step: brings gradients that are not views of the buffer
        into it; refuses parameters whose values changed since they were
        pulled, or whose requires_grad changed since the model was
        registered. `views`: (parameter, its view of the flat parameters,
        of the flat gradients) in order; `name_of_frozen`: a frozen
        parameter's name."""
        # (Compared bit for bit: a NaN the servers wrote is not a change.)
        changed = self.pulled is not None and not torch.equal(
            self.flat_params.view(torch.int32), self.pulled.view(torch.int32))
        # The model's layout is fixed at registration: a parameter frozen
        # since would still be pushed (zeros) and updated, one unfrozen
        # since never trained. Said, not done silently.
        for p, name in zip(self.params, self.names):
            if not p.requires_grad:
                raise FailedPreconditionError(
                    f"FAILED_PRECONDITION: parameter {name!r} was frozen (requires_grad=False) "
                    "after the optimizer was built, which still updates it; freeze parameters "
                    "before building the optimizer (or build a new one)")
        for p in self.frozen:
            if p.requires_grad:
                raise FailedPreconditionError(
                    f"FAILED_PRECONDITION: parameter {name_of_frozen(p)!r} was frozen when the "
                    "optimizer was built and requires grad now: the servers do not hold it, so "
                    "it would never be trained; build a new optimizer to train it")
        for p, name, (_, view, grad_view) in zip(self.params, self.names, views):
            if changed or p.data_ptr() != view.data_ptr():
                raise FailedPreconditionError(
                    "FAILED_PRECONDITION: the parameters were changed after the optimizer was "
                    f"built ({name!r} or another): the shard servers hold the master weights "
                    "and the next pull would overwrite them. Build the optimizer after "
                    "loading the weights")
            if p.grad is None:
                raise FailedPreconditionError(
                    f"FAILED_PRECONDITION: parameter {name!r} has no gradient at this step: "
                    "shardopt updates every parameter at every step (torch.optim would skip "
                    "it); use zero_grad() without set_to_none, or freeze it "
                    "(requires_grad=False) before building the optimizer")
            if p.grad.data_ptr() != grad_view.data_ptr():
                grad_view.copy_(p.grad)
                p.grad = grad_view
                self.broken = True  # What was streamed is not this gradient.

    def take_what_servers_wrote(self):
        """After a step that failed: a pull may have written some shards'
        ranges into the parameters before it failed (shared memory, the
        early pull). That is the servers' doing, not a change of the
        user's, and the step's retry pulls them whole."""
        if self.pulled is not None:
            self.pulled.copy_(self.flat_params)

    def pull_with(self, pull):
        """Calls pull(float32 numpy array) to fill the flat parameters (through
        a host copy when they live on a GPU); returns what it returns."""
        if self.flat_params.device.type == "cpu":
            return pull(self.flat_params.numpy())
        host = torch.empty(self.flat_params.numel(), dtype=torch.float32)
        result = pull(host.numpy())
        self.flat_params.copy_(host)
        return result

    def run_step(self, version):
        """The group's step from its flat buffers (not streamed)."""
        if not self.device_buffers:
            return self.client.step(version, self.flat_grads.numpy(), self.flat_params.numpy())
        if self.flat_grads.is_cuda:
            # The gradient's kernels are done before the client reads it.
            torch.cuda.current_stream(self.flat_grads.device).synchronize()
        return self.client.step_on_device(version, self.flat_grads.data_ptr(),
                                          self.flat_params.data_ptr())

    def use_shared_buffers(self):
        """Moves the flat buffers into the client's shared-memory segment
        (after register), where co-located shards read pushes and write
        pulls in place; nothing changes without one."""
        grads, params = self.client.shared_gradients(), self.client.shared_parameters()
        if grads is None:
            return
        self.flat_grads = torch.frombuffer(grads, dtype=torch.float32)
        in_segment = torch.frombuffer(params, dtype=torch.float32)
        in_segment.copy_(self.flat_params)
        self.flat_params = in_segment

    def abandon_stream(self):
        """Ends the step's streamed push, if any, unused by the shards."""
        if self.streaming:
            self.client.cancel_streamed_push()
        self.reset_stream()

    def reset_stream(self):
        self.fired = set()
        self.pending = None      # Per bucket: parameters still to come.
        self.streaming = False
        self.broken = False      # Something the stream cannot follow happened.
        self.grads_outside = False  # Backward made gradients outside the buffer.


def hook_buckets(g, total, bucket_elements, on_final):
    """Cuts g's flat buffer (`total` elements) into buckets of about
    `bucket_elements`, at tensor boundaries, and hooks every parameter's
    gradient accumulator to call on_final(g, j) once parameter j's gradient
    of this backward pass is accumulated (kept alive in g.accumulators).
    The hooks hold g weakly and go when g does: the accumulators are
    autograd's, shared with any later optimizer built on the same
    parameters, whose g.accumulators would otherwise keep this g (its
    client, connections and flat buffers) alive through them."""
    starts = []
    g.bucket_of = [0] * len(g.slices)
    # By offset: with the whole_tensors partition the parameters' order in
    # the buffer is not theirs.
    for j in sorted(range(len(g.slices)), key=lambda j: g.slices[j][0]):
        offset = g.slices[j][0]
        if not starts or offset - starts[-1] >= bucket_elements:
            starts.append(offset if starts else 0)
        g.bucket_of[j] = len(starts) - 1
    g.buckets = [(b, starts[i + 1] if i + 1 < len(starts) else total)
                 for i, b in enumerate(starts)]
    handles = []
    weak_g = weakref.ref(g)

    def final(j):
        group = weak_g()
        if group is not None:
            on_final(group, j)

    with torch.enable_grad():  # (Also when built under no_grad.)
        for j, p in enumerate(g.params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            handles.append(accumulator.register_hook(
                lambda grad_inputs, grad_outputs, j=j: final(j)))
            g.accumulators.append(accumulator)
    weakref.finalize(g, _remove_hooks, handles)


def _remove_hooks(handles):
    for handle in handles:
        handle.remove()
