"""The end of a job for shardopt.torch's DistributedOptimizer: finish() (the
last step saved where the servers keep checkpoints) and
wait_for_every_trainer(). A mixin: it uses the optimizer's groups, version,
consistency and rollback handling."""

from . import AbortedError


class JobEnd:
    """finish() and wait_for_every_trainer() of DistributedOptimizer."""

    def finish(self):
        """At the end of a job, after the last step() (every rank calls it):
        waits until every shard holds every rank's steps up to this rank's last
        one and, where the shard servers keep periodic checkpoints
        (--checkpoint_dir), saves that step as one, so that a shard restarting
        afterwards comes back there and no rank is needed any more (a rank may
        exit). Asynchronous: then pulls the final parameters into the model.
        True when done; False when the job had to roll back meanwhile (a
        RuntimeWarning says so): the model then holds the parameters of
        step_count, from which to train on and call finish() again. (Should
        that pull fail, its error is raised; the next call pulls first.)"""
        for g in self._groups:
            g.abandon_stream()
            if g.resume_pending:  # (A pull after a rollback failed: that first.)
                self._resume(g)
                return False
            try:
                g.client.finish(self._version)
            except AbortedError:
                if g.client.rolled_back_to is None or len(self._groups) > 1:
                    raise
                self._follow_rollback(g, stacklevel=3)  # (The warning names the caller.)
                return False
        if self._consistency != "sync":
            for g in self._groups:
                try:
                    g.pull_with(lambda params, g=g: g.client.pull(0, params))
                finally:
                    g.take_what_servers_wrote()
        return True

    def wait_for_every_trainer(self):
        """At the end of an asynchronous job: waits until every shard holds every
        rank's steps up to this rank's last one (re-sending this rank's own that a
        restarted shard lacks), then pulls the final parameters into the model.
        Returns at once in synchronous mode, where every rank is there already."""
        if self._consistency == "sync":
            return
        for g in self._groups:
            g.client.wait_for_every_trainer(self._version)
            try:
                g.pull_with(lambda params, g=g: g.client.pull(0, params))
            finally:
                g.take_what_servers_wrote()
