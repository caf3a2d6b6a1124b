"""shardopt.torch's pushes during backward() (overlap_backward): the hooks on
the gradient accumulators that send each bucket of the flat gradient once
all its gradients are final, and the bookkeeping of steps whose gradient
changed after it was sent. A mixin of DistributedOptimizer, whose state
(_overlap_backward, _bucket_elements, _version, _send_hyperparameters) it
uses."""

import warnings
import weakref

from ._group import hook_buckets


class BackwardStreaming:
    """DistributedOptimizer's streaming of gradient buckets during backward()."""

    def _hook_buckets(self, g, total):
        # The hooks hold the optimizer weakly: g.accumulators keeps the
        # accumulators (and so the hooks) alive, and g must not keep the
        # optimizer alive through them.
        me = weakref.ref(self)

        def final(g, j):
            opt = me()
            if opt is not None:
                opt._gradient_final(g, j)

        hook_buckets(g, total, self._bucket_elements, final)

    def _gradient_final(self, g, j):
        """Autograd accumulated parameter j's gradient (a backward hook)."""
        if g.broken or g.no_stream or not self._overlap_backward:
            return
        p, (offset, size) = g.params[j], g.slices[j]
        in_buffer = p.grad is not None and \
            p.grad.data_ptr() == g.flat_grads[offset:offset + size].data_ptr()
        if j in g.fired or not in_buffer:
            # A second backward before the step (accumulation), or a gradient
            # outside the buffer: the streamed data would not be final.
            if not in_buffer and not g.fired:
                g.grads_outside = True  # (Set to None before backward: see below.)
            g.broken = True
            return
        g.fired.add(j)
        if not g.streaming:
            try:
                # A change since the last step (an lr scheduler's) goes
                # first: the streamed push carries it.
                self._send_hyperparameters(g, self._version + 1)
                g.client.begin_streamed_push(self._version + 1, g.flat_grads.numpy())
            except Exception:  # pylint: disable=broad-except
                # Nothing may escape into backward(): step() pushes whole,
                # and raises what failed if it fails again.
                g.broken = True
                return
            g.streaming = True
            g.pending = [0] * len(g.buckets)
            for b in g.bucket_of:
                g.pending[b] += 1
        b = g.bucket_of[j]
        g.pending[b] -= 1
        if g.pending[b] == 0:
            g.client.mark_gradient_ready(*g.buckets[b])

    def _note_gradients_outside(self, g):
        """Says once why nothing is pushed during backward() when the
        gradients keep being set to None before it (torch 2's
        ``model.zero_grad()``): autograd then makes new gradient tensors,
        outside the buffer the pushes read, and each step goes whole."""
        g.outside_in_a_row = g.outside_in_a_row + 1 if g.grads_outside else 0
        if g.outside_in_a_row == 3 and self._overlap_backward:
            warnings.warn(
                "shardopt.torch: the gradients were set to None before backward() in three "
                "steps in a row (model.zero_grad() or zero_grad(set_to_none=True); torch 2 "
                "sets them to None by default), so autograd made new tensors and nothing "
                "could be pushed during backward(): each step pushed its gradient whole. "
                "Call the optimizer's zero_grad() instead, which zeroes them in place",
                RuntimeWarning, stacklevel=4)

    def _note_changed_gradient(self, g, changed):
        """Stops streaming for a loop that changes its gradients after
        backward() every time (each such step sends its gradient twice)."""
        g.changed_in_a_row = g.changed_in_a_row + 1 if changed else 0
        if g.changed_in_a_row >= 3 and self._overlap_backward:
            self._overlap_backward = False
            warnings.warn(
                "shardopt.torch: the gradients changed after parts of them were sent during "
                "backward() in three steps in a row (clip_grad_norm_ or in-place scaling after "
                "backward, a second backward() before step(), a replaced .grad, an lr or "
                "other hyperparameter changed between backward() and step()), so each was "
                "pushed twice; pushing during backward is off from now on. Clip on the servers "
                "with max_grad_norm, or pass overlap_backward=False", RuntimeWarning,
                stacklevel=4)

