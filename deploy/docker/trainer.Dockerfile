# shardopt's C++ trainers: mlp_trainer (the main job) and test_trainer (the
# integration tests' synthetic trainer). No entrypoint: the compose file
# names the program. Neither handles SIGTERM, so run it under an init
# (`init: true`): as PID 1 it would ignore the signal.
ARG TAG=latest
FROM shardopt-runtime:${TAG}
COPY mlp_trainer test_trainer /usr/local/bin/
CMD ["/usr/local/bin/mlp_trainer", "--help"]
