"""shardopt.torch: a PyTorch optimizer whose state lives on shardopt servers.

Swap

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

for

    opt = shardopt.torch.DistributedOptimizer(
        model.parameters(), servers=["host:50051", "host:50052"],
        rank=rank, world_size=world_size, optimizer="adamw", lr=1e-3)

and keep the loop: ``opt.zero_grad(); loss.backward(); opt.step()``.

How it works:

* Each parameter group becomes one shardopt model (``model_id``, or
  ``model_id.g<i>`` with several groups) with that group's hyperparameters;
  its tensors are laid out in one flat float32 buffer (the servers' layout).
* The parameters' storage is moved into that buffer, and their ``.grad`` are
  views of a second one: autograd accumulates into it in place, ``step()``
  hands both buffers to the C++ client without copying them, and the pulled
  parameters land directly in the parameters (a ``.grad`` replaced by other
  code is copied in once and re-attached).
* The servers hold the master weights: the parameters' values are taken at
  construction (rank 0's). Changing them afterwards (``load_state_dict`` on
  the model, writing ``.data``) would be overwritten by the next pull, so
  ``step()`` refuses with FailedPreconditionError instead (build the
  optimizer after loading the weights; ``check_parameters=False`` skips this
  check, which costs a copy and a comparison of the parameters per step).
* Parameters with ``requires_grad=False`` are left out (frozen).
* Rank 0 registers the model with its initial values; the other ranks attach
  and start from those values (as DistributedDataParallel broadcasts rank
  0's). Gradients are averaged over the ``world_size`` trainers on the
  servers, so each trainer back-propagates the mean loss of its share of the
  batch.
* Changes to ``param_groups[i][...]`` hyperparameters (by hand or by a
  ``torch.optim.lr_scheduler``) are sent to the servers and take effect at
  the next step on every shard.
* ``state_dict()`` saves a checkpoint on the servers (with
  ``checkpoint_dir``) and returns where; the optimizer state itself stays on
  the servers. Asynchronous and bounded: the cut at this rank's step, so
  every rank calls it at the same step (a rank already past it makes the
  call fail with FAILED_PRECONDITION). ``load_state_dict()`` accepts a state dict of the step the
  servers are at (restart the servers with ``--restore_from`` to go back to
  an older one).

When the job rolls back to a checkpoint (a shard came back without steps that
no trainer can send again: docs/checkpoints.md), ``step()`` pulls that
checkpoint's parameters and returns without applying this step's gradient
(a RuntimeWarning; ``last_results[0]["rolled_back_to"]`` and ``step_count``
say where the job went on from); the loop simply continues. With several
parameter groups (each its own model) it raises AbortedError instead.

Differences from torch.optim: every trainable parameter is updated at every
step, so a parameter without a gradient (after ``zero_grad(set_to_none=True)``)
is refused rather than skipped; with the default ``zero_grad()`` an unused
parameter has a zero gradient, as in torch.optim before 2.0 (torch 2's
``zero_grad()`` sets gradients to None and its ``step()`` skips such a
parameter; here the zero gradient is applied, so weight decay, momentum and
Adam's moments still move it). Parameters cannot be added
after construction (the model is registered then), nor frozen or unfrozen
(``requires_grad`` is read then; the next ``step()`` refuses a change), and
``max_grad_norm`` and ``loss_scaler`` need a single parameter group (each
group is its own model on the servers).
"""

import warnings

import torch

from torch.optim.optimizer import required

from . import AbortedError, Client, FailedPreconditionError
from ._backward_streaming import BackwardStreaming
from ._group import Group
from ._hyperparameter_sync import HyperparameterSync
from ._job_end import JobEnd
from ._optimizers import OPTIMIZERS as _OPTIMIZERS
from ._optimizers import WHOLE_TENSOR_OPTIMIZERS as _WHOLE_TENSOR_OPTIMIZERS
from ._server_state import ServerState



class DistributedOptimizer(BackwardStreaming, HyperparameterSync, ServerState, JobEnd,
                           torch.optim.Optimizer):
    """A torch.optim-style optimizer backed by shardopt shard servers.

    Args:
      params: the parameters (an iterable of tensors, of (name, tensor)
        pairs as from ``named_parameters()``, or of parameter-group dicts).
        They must be float32, contiguous CPU tensors.
      servers: the shard servers' addresses, in shard order.
      rank, world_size: this trainer's rank among ``world_size`` trainers.
      optimizer: "sgd", "adam", "adamw", "adagrad", "lion", "lamb" or
        "adafactor"; the other keyword arguments are its hyperparameters,
        named as in torch.optim (Lion's as in lion-pytorch: lr, betas,
        weight_decay; LAMB's as apex's FusedLAMB: lr, betas, eps,
        weight_decay, bias_correction, and the trust ratio's clamp
        min_trust_ratio, max_trust_ratio (DeepSpeed's min/max_coeff);
        Adafactor's as torch.optim.Adafactor: lr, beta2_decay, eps, d,
        weight_decay).
        "muon" is torch.optim.Muon's (lr, weight_decay, momentum, nesterov,
        ns_coefficients, eps, ns_steps, adjust_lr_fn) for 2-D parameters
        only: as in the reference recipes, put the others (biases,
        embeddings, norms) in a parameter group of their own with
        ``"optimizer": "adamw"`` (and its hyperparameters): a parameter
        group may name its own optimizer this way, each group being its own
        model on the servers.
      partition: "flat" (an even split of the flat buffer, tensors may
        straddle shards) or "whole_tensors" (each tensor on one shard,
        shards balanced by size); None (the default) picks "whole_tensors"
        for "lamb", "adafactor" and "muon", and "flat" otherwise (per
        parameter group). "adafactor" and "muon" need "whole_tensors";
        "lamb" runs on "flat" too (even shards; each step then gathers
        every tensor's norms from all shards before updating, the same
        bits, synchronous consistency only, pushed after backward).
      model_id: the model's name on the servers (one per training job).
      max_grad_norm: > 0 clips the global gradient norm on the servers.
      checkpoint_dir: where ``state_dict()`` makes the servers save.
      rpc_timeout, retry_budget: seconds (see TrainerClientOptions).
      replay_steps, journal_path: crash recovery (docs/checkpoints.md).
      security: how to reach secured servers, a dict of ``tls_ca_file``,
        ``tls_cert_file``, ``tls_key_file``, ``tls_server_name``,
        ``auth_token`` / ``auth_token_file`` (see ``shardopt.Client``).
      check_parameters: refuse a step when the parameters were changed since
        the last pull (see the module docstring).
      push_dtype, pull_dtype: "float32", "bfloat16" or "float16" on the wire.
      overlap_backward: (on by default) push the gradient bucket by bucket
        (``bucket_cap_mb`` each) while ``backward()`` is still running, as
        DDP's reducer does: hooks on the parameters' gradient accumulators
        send each bucket once all its gradients are final, the parameters
        laid out in reverse so that backward fills the buffer from its start;
        ``step()`` then checks the whole gradient, compares what was sent with
        it (a digest per chunk), lets the shards use it and pulls. A gradient
        changed between ``backward()`` and ``step()`` (``clip_grad_norm_``,
        in-place scaling) is found there and pushed whole instead: exact, but
        the streamed bytes were wasted, so after three such steps in a row
        streaming stops with a warning (clip with ``max_grad_norm`` on the
        servers instead). Streaming turns itself off with ``max_grad_norm``,
        a loss scaler, a 16-bit ``push_dtype`` or a ``journal_path`` (the
        reversed layout stays), and a step with a second ``backward()``
        before it (gradient accumulation) or a gradient replaced outside the
        buffer is pushed whole. The same bits as without in every case. The
        flag decides the layout: every rank and restart of a job must pass
        the same value (``False`` keeps the parameters' own order, as
        before this default).
        16-bit pushes round each gradient once (as ``.to(torch.bfloat16)``
        would); 16-bit pulls leave the parameters holding the servers' fp32
        master weights rounded to that type (the master weights and the
        optimizer state stay fp32 on the servers), as in mixed-precision
        training with fp32 masters.
      loss_scaler: a dict of dynamic loss scaling options (Megatron's
        DynamicGradScaler: initial_scale, min_scale, max_scale, growth_factor,
        backoff_factor, growth_interval, hysteresis; ``{}`` for its defaults)
        turns it on. Back-propagate ``opt.scale(loss)`` (the loss times
        ``opt.loss_scale``); the servers unscale the gradients, and a step
        whose gradients overflowed anywhere is skipped on every shard (its
        result says ``skipped``) and backs the scale off. Needs a single
        parameter group.
      shared_memory: (on by default) with shard servers on this host (same
        user, same network namespace), gradients and parameters move through
        a shared-memory segment the servers map instead of the gRPC stream:
        the flat buffers the parameters and gradients live in are that
        segment, so a push is read by the servers in place and a pull is
        written straight into the parameters. Other servers get the stream.
        Same bits either way; ``False`` always streams.
      socket_payloads: (on by default) with shard servers reached over
        plaintext that shared memory does not reach, the bytes of pushes and
        pulls go over a plain TCP connection to the server's payload socket
        instead of HTTP/2 frames in the gRPC stream (the calls and their
        answers stay on gRPC; never over TLS). Same bits either way.
      device_pairs: "off" (the default), "nccl" or "loopback": fp32 pushes
        and pulls go over a device pair with each server that opens pairs of
        that kind (server ``--device_pairs``; "nccl": servers on GPUs),
        before the other data planes. With "nccl" the parameters may be CUDA
        tensors on ``cuda:<device_pair_gpu>``: the flat buffers are then on
        that GPU, the gradient goes from there and the parameters come back
        there (a host copy of the gradient is kept for the client's checks
        and any server without pairs); CPU parameters go through the pairs'
        GPU buffers. "loopback" (the NCCL protocol in host memory, for CPU
        servers) runs that GPU trainer path on the CPU. No pushes during
        backward on that path. Same bits either way.
      consistency: "sync" (the default: step k is applied once every rank
        pushed it, from the mean of their gradients), "async" (each rank's
        step is applied on the servers alone, as it arrives, as PyTorch RPC's
        DistributedOptimizer does; ``step()`` then pulls the newest
        parameters) or "bounded" (async, and a rank's step k waits until
        every rank has pushed step k - ``staleness``). In the asynchronous
        modes ``max_grad_norm`` clips each rank's own gradient by its own
        norm and a loss scaler is each rank's own (a rank's overflowing step
        is skipped by it alone); they take no hyperparameter changes after
        the first step and no streaming during backward (the reversed
        layout stays); the lr schedule counts each rank's own steps.
      staleness: the bound s >= 1 of "bounded".
    """

    def __init__(self, params, servers, rank, world_size, optimizer="adamw",
                 model_id="model", max_grad_norm=0.0, checkpoint_dir=None,
                 rpc_timeout=60.0, retry_budget=60.0, replay_steps=0, journal_path="",
                 check_parameters=True, push_dtype="float32", pull_dtype="float32",
                 loss_scaler=None, security=None, overlap_backward=True, bucket_cap_mb=1.0,
                 shared_memory=True, socket_payloads=True, consistency="sync", staleness=0,
                 partition=None, device_pairs="off", device_pair_gpu=0,
                 **hyperparameters):
        # torch.optim's implementation switches: accepted, meaningless here.
        for switch in ("foreach", "capturable", "differentiable", "fused"):
            hyperparameters.pop(switch, None)
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r} (one of {sorted(_OPTIMIZERS)})")
        unknown = set(hyperparameters) - set(_OPTIMIZERS[optimizer])
        if unknown:
            raise ValueError(f"{optimizer} has no hyperparameter(s) {sorted(unknown)}")
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, not {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank!r} is not in [0, world_size={world_size})")
        if isinstance(servers, (str, bytes)):
            raise TypeError(f"servers must be a list of addresses, not one string {servers!r} "
                            "(write [address] for one shard server)")
        if not servers:
            raise ValueError("no shard servers given")
        self._kind = optimizer
        self._servers = list(servers)
        self._rank = rank
        self._world_size = world_size
        self._model_id = model_id
        self._max_grad_norm = float(max_grad_norm)
        self._loss_scaler = None if loss_scaler is None else dict(loss_scaler)
        self._checkpoint_dir = checkpoint_dir
        if consistency not in ("sync", "async", "bounded"):
            raise ValueError(f"consistency {consistency!r} is not one of 'sync', 'async', "
                             "'bounded'")
        self._consistency = consistency
        self._staleness = int(staleness)
        if device_pairs not in ("off", "nccl", "loopback"):
            raise ValueError(f"device_pairs {device_pairs!r} is not one of 'off', 'nccl', "
                             "'loopback'")
        if partition not in (None, "flat", "whole_tensors"):
            raise ValueError(f"partition {partition!r} is not one of 'flat', 'whole_tensors'")
        self._partition = partition
        self._client_args = dict(rpc_timeout_s=float(rpc_timeout),
                                 retry_budget_s=float(retry_budget),
                                 replay_steps=int(replay_steps),
                                 push_dtype=push_dtype, pull_dtype=pull_dtype,
                                 security=dict(security or {}),
                                 shared_memory=bool(shared_memory),
                                 socket_payloads=bool(socket_payloads),
                                 device_pairs=str(device_pairs),
                                 device_pair_gpu=int(device_pair_gpu))
        self._journal_path = journal_path
        self._check_parameters = check_parameters
        # The layout follows the flag alone (every rank and every restart
        # must lay the model out alike); streaming also needs the gradient's
        # parts to be final on their own: not with clipping or loss scaling
        # (the whole gradient's statistics), a 16-bit push type, or a journal.
        self._reverse_layout = bool(overlap_backward)
        self._overlap_backward = self._reverse_layout and self._max_grad_norm == 0 and \
            self._loss_scaler is None and push_dtype == "float32" and not journal_path and \
            consistency == "sync"
        self._bucket_elements = max(1, int(float(bucket_cap_mb) * (1 << 20)) // 4)
        self._names = {}
        self._registered = False
        defaults = dict(_OPTIMIZERS[optimizer])
        defaults.update(hyperparameters)
        params = self._take_names(params)
        super().__init__(params, defaults)
        # A group of frozen parameters alone has no model on the servers.
        trained = [i for i, group in enumerate(self.param_groups)
                   if any(p.requires_grad for p in group["params"])]
        if not trained:
            raise ValueError("no parameter requires grad: there is nothing to optimize")
        if self._max_grad_norm > 0 and len(trained) > 1:
            raise ValueError("max_grad_norm clips one model's global norm: it needs a single "
                             "parameter group (each group is its own model on the servers)")
        if self._loss_scaler is not None and len(trained) > 1:
            raise ValueError("loss scaling skips a step for the whole model: it needs a single "
                             "parameter group (each group is its own model on the servers)")
        seen = set()
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) in seen:
                    raise ValueError(f"parameter {self._names.get(id(p), '')!r} appears twice")
                seen.add(id(p))
        self._groups = [self._register(i, self.param_groups[i]) for i in trained]
        # (A frozen group's parameters that require grad later are refused
        # at the step, as a trained group's frozen ones are.)
        for i, group in enumerate(self.param_groups):
            if i not in trained:
                self._groups[0].frozen.extend(group["params"])
        self._registered = True
        # (Not _step_count: torch's lr schedulers use that name on optimizers.)
        # A trainer restarted between its groups' pushes of a step finds the
        # groups one version apart: it goes on from the lower one, and the
        # step skips the groups already past it (as after a failed step()).
        self._version = min(g.version for g in self._groups)
        if max(g.version for g in self._groups) > self._version + 1:
            raise FailedPreconditionError(
                "FAILED_PRECONDITION: the parameter groups' models are at versions "
                f"{[g.version for g in self._groups]}, more than one step apart (restart the "
                "servers from a common checkpoint)")
        for g in self._groups:
            if g.version > self._version:  # What its (skipped) next step reports.
                g.last_result = self._result_without_push(g, applied_before_restart=True)
        self.last_results = []

    # -- construction --------------------------------------------------------

    def _take_names(self, params):
        """Accepts (name, tensor) pairs: remembers the names, returns tensors."""
        if isinstance(params, torch.Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors or dicts, but got " + torch.typename(params))
        if isinstance(params, (set, frozenset)):
            raise TypeError("params must be an ordered collection (a set's order differs "
                            "between trainer processes, which must lay the tensors out alike)")
        params = list(params)
        if params and isinstance(params[0], tuple):
            out = []
            for name, tensor in params:
                self._names[id(tensor)] = name
                out.append(tensor)
            return out
        return params

    def add_param_group(self, param_group):
        if getattr(self, "_registered", False):
            raise FailedPreconditionError(
                "FAILED_PRECONDITION: parameters cannot be added after the optimizer is built: "
                "the model is registered on the shard servers with a fixed layout; build a new "
                "DistributedOptimizer (another model_id) with every parameter")
        params = param_group["params"]
        if isinstance(params, (set, frozenset)):
            raise TypeError("a parameter group's params must be an ordered collection, not a set")
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        if params and isinstance(params[0], tuple):  # Named, as torch 2 takes them.
            params = self._take_names(params)
        param_group = dict(param_group, params=params)
        kind = param_group.get("optimizer")
        if kind is not None:
            # A group of its own optimizer: its defaults, not the main one's.
            if kind not in _OPTIMIZERS:
                raise ValueError(f"parameter group optimizer {kind!r} is not one of "
                                 f"{sorted(_OPTIMIZERS)}")
            for key, value in _OPTIMIZERS[kind].items():
                param_group.setdefault(key, value)
            for key, value in param_group.items():
                if value is required:
                    raise ValueError(f"parameter group didn't specify a value of required "
                                     f"optimization parameter {key}")
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameters must be tensors, not {type(p).__name__}")
            if not p.requires_grad:
                continue  # Left out of the model: any dtype, device or layout.
            if p.dtype != torch.float32 or p.device != self._param_device(p):
                raise ValueError(
                    f"parameter {self._names.get(id(p), '')!r} is {p.dtype} on {p.device}; "
                    "shardopt trains float32 parameters on the CPU, or (device_pairs='nccl') "
                    f"on cuda:{self._client_args['device_pair_gpu']}")
            if not p.is_contiguous():
                raise ValueError(
                    f"parameter {self._names.get(id(p), '')!r} of shape {tuple(p.shape)} is not "
                    "contiguous: make it contiguous (p.data = p.data.contiguous()) first")
        super().add_param_group(param_group)

    def _param_device(self, p):
        """Where a parameter may live: the CPU, or with NCCL pairs on
        device_pair_gpu (then the flat buffers are there too)."""
        if self._client_args["device_pairs"] == "nccl" and p.device.type == "cuda":
            return torch.device("cuda", self._client_args["device_pair_gpu"])
        return torch.device("cpu")

    def _kind_of(self, group):
        """The optimizer of a parameter group (its own "optimizer", or the main one)."""
        return group.get("optimizer", self._kind)

    def _register(self, index, group):
        model_id = self._model_id if len(self.param_groups) == 1 else f"{self._model_id}.g{index}"
        journal = f"{self._journal_path}.g{index}" if self._journal_path else ""
        client = Client(self._servers, self._rank, journal_path=journal,
                                  **self._client_args)
        # Frozen parameters stay out of the model (named by their place in the group).
        indexed = [(j, p) for j, p in enumerate(group["params"]) if p.requires_grad]
        if not indexed:
            raise ValueError(f"parameter group {index} has no parameter that requires grad")
        if self._reverse_layout:
            # Backward produces the last parameters' gradients first: laid
            # out in reverse, the gradient becomes final from the buffer's
            # start, the order a push streams in.
            indexed.reverse()
        params = [p for _, p in indexed]
        names = [self._names.get(id(p), f"param{j}") for j, p in indexed]
        g = Group(index, client, model_id, params, names)
        g.frozen = [p for p in group["params"] if not p.requires_grad]
        tensors = [(n, list(p.shape)) for n, p in zip(names, params)]
        kind = self._kind_of(group)
        partition = self._partition or (
            "whole_tensors" if kind in _WHOLE_TENSOR_OPTIMIZERS else "flat")
        # LAMB on the flat partition over several shards takes each step's
        # tensor norms from every shard before the update: pushed whole.
        g.no_stream = kind == "lamb" and partition == "flat" and len(self._servers) > 1
        layout = client.layout_for(tensors, partition)
        total = layout[-1][2]
        # GPU parameters (NCCL pairs) keep their flat buffers on the GPU;
        # the loopback stand-in runs the same path in host memory.
        device = params[0].device
        if any(p.device != device for p in params):
            raise ValueError(f"parameter group {index} has parameters on several devices")
        g.device_buffers = device.type == "cuda" or \
            self._client_args["device_pairs"] == "loopback"
        g.no_stream = g.no_stream or g.device_buffers  # (Streams read host buffers.)
        g.flat_params = torch.zeros(total, dtype=torch.float32, device=device)
        g.flat_grads = torch.zeros(total, dtype=torch.float32, device=device)
        for (name, shape, offset, size), p in zip(layout[:-1], params):
            g.slices.append((offset, size))
            g.flat_params[offset:offset + size].copy_(p.detach().reshape(-1))
        hyper = self._hyperparameters(group)
        client.register(model_id, tensors, kind, hyper, self._world_size,
                        self._max_grad_norm,
                        g.flat_params.cpu().numpy() if self._rank == 0 else None,
                        loss_scaler=self._loss_scaler, consistency=self._consistency,
                        staleness=self._staleness, partition=partition)
        # A synchronous model that existed already (restored, or running)
        # keeps the hyperparameters it has: this group takes them once the
        # version is known (below). (Asynchronous models take no changes:
        # only a real one is sent, and refused.)
        if g.device_buffers and client.device_pair_kind != self._client_args["device_pairs"]:
            raise RuntimeError(
                f"parameters on {device} need {self._client_args['device_pairs']} device pairs, "
                "which cannot run in this process (see the log: NCCL did not load?)")
        g.sent_hyperparameters = hyper if client.registered_version == 0 or \
            self._consistency != "sync" else None
        g.sent_for_step = None
        if not g.device_buffers:
            g.use_shared_buffers()  # (Before any view of the flat buffers is handed out.)
        # Everyone starts from the servers' values (rank 0's, or where a
        # restored or running job is; a step this rank's earlier process
        # left half-used in a pipelined step rolls the job back here).
        g.version = g.pull_with(client.pull_to_resume)
        if g.sent_hyperparameters is None:
            self._take_the_models_hyperparameters(g, group)
        g.pulled = g.flat_params.clone() if self._check_parameters else None
        for p, view, grad_view in self._views(g):
            p.data = view
            p.grad = grad_view
        if self._overlap_backward:
            self._hook_buckets(g, total)
        return g

    def _views(self, g):
        for p, (offset, size) in zip(g.params, g.slices):
            yield (p, g.flat_params[offset:offset + size].view(p.shape),
                   g.flat_grads[offset:offset + size].view(p.shape))

    # -- training ------------------------------------------------------------

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (they are views of the pushed buffer).

        With set_to_none, the gradients become None as in torch.optim (autograd
        then makes new ones, copied into the buffer at the step; a parameter
        still without one is refused at the step).
        """
        for g in self._groups:
            g.abandon_stream()  # Its gradient is being zeroed.
            g.flat_grads.zero_()
            for p, _, grad_view in self._views(g):
                if set_to_none:
                    p.grad = None
                elif p.grad is None or p.grad.data_ptr() != grad_view.data_ptr():
                    p.grad = grad_view

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self._groups:
            if g.resume_pending:  # (A single group: see _follow_rollback.)
                g.abandon_stream()
                self._resume(g)
                return loss
        version = self._version + 1
        for g in self._groups:
            self._gather(g)
        results = []
        for i, g in enumerate(self._groups):
            if g.version == version:  # Done by an earlier call that failed later.
                g.abandon_stream()
                results.append(g.last_result)
                continue
            streamed = g.streaming and not g.broken
            # A stream that started but broke (a second backward, a replaced
            # .grad) sent its bytes for nothing, as a changed gradient does.
            wasted = g.streaming and g.broken
            if self._send_hyperparameters(g, version):
                # Changed after backward (a scheduler stepped before the
                # optimizer): that ended the stream, sent for nothing.
                wasted = wasted or streamed
                streamed = False
            self._note_gradients_outside(g)
            # A failure leaves this step to be tried again (pushes are
            # idempotent per trainer and step). A streamed push that cannot
            # be finished falls back to a whole one by itself.
            if streamed:
                g.reset_stream()
            else:
                g.abandon_stream()
            try:
                if streamed:
                    changed_before = g.client.streamed_pushes_changed
                    g.last_result = g.client.finish_streamed_step(
                        version, g.flat_grads.numpy(), g.flat_params.numpy())
                    self._note_changed_gradient(
                        g, g.client.streamed_pushes_changed > changed_before)
                else:
                    if self._overlap_backward:
                        self._note_changed_gradient(g, wasted)
                    g.last_result = g.run_step(version)
            except AbortedError:
                if g.client.rolled_back_to is None or len(self._groups) > 1:
                    g.take_what_servers_wrote()
                    raise
                self._follow_rollback(g)
                return loss
            except BaseException:
                g.take_what_servers_wrote()
                raise
            g.version = version
            if g.pulled is not None:
                g.pulled.copy_(g.flat_params)
            results.append(g.last_result)
        self._version = version
        self.last_results = results
        return loss

    def _follow_rollback(self, g, stacklevel=4):
        """The job rolled back to a checkpoint (a shard came back without
        steps no trainer could send again): goes on from there, as every
        other trainer does."""
        back = g.client.rolled_back_to  # (The client has re-attached there.)
        g.version = self._version = back
        # The shards went back to that checkpoint's hyperparameters: the
        # next step sends the current ones again.
        g.sent_hyperparameters = None
        g.sent_for_step = None
        g.resume_pending = True
        warnings.warn(f"shardopt.torch: the job rolled back to step {back} (see the shard "
                      "servers' logs for why); training goes on from there", RuntimeWarning,
                      stacklevel=stacklevel)
        self._resume(g)

    def _resume(self, g):
        """Pulls the parameters to go on from after a rollback. If that fails,
        the next step() tries again first (and drops its gradient, computed
        from parameters half pulled)."""
        version = g.pull_with(g.client.pull_to_resume)
        g.resume_pending = False
        g.version = self._version = version
        if g.pulled is not None:
            g.pulled.copy_(g.flat_params)
        g.last_result = self._result_without_push(g, rolled_back_to=version)
        self.last_results = [g.last_result]

    def _result_without_push(self, g, **marks):
        """The result a step reports for group g at g.version without having
        pushed anything: the usual keys (as the last result had them), the
        version, the group's lr, and `marks` saying why."""
        result = dict(g.last_result) if isinstance(g.last_result, dict) else {}
        result.update(step=g.version, version=g.version, skipped=False, applied_here=False,
                      bytes_pushed=0, bytes_pushed_early=0, duplicate_pushes=0, replayed_pushes=0,
                      lr=float(self.param_groups[g.index]["lr"]), **marks)
        return result

    def _gather(self, g):
        """See Group.gather."""
        g.gather(self._views(g),
                 lambda p: self._names.get(id(p), "of shape " + str(list(p.shape))))

    @property
    def loss_scale(self):
        """What the next step's loss is multiplied by (1.0 without loss scaling)."""
        return self._groups[0].client.loss_scale

    def scale(self, loss):
        """``loss * loss_scale``: back-propagate this with loss scaling on."""
        return loss * self.loss_scale

    @property
    def step_count(self):
        """The version the servers' model is at, as this trainer knows it."""
        return self._version
