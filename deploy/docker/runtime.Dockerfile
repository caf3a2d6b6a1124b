# The shared libraries and dynamic loader of shardopt's binaries, at the
# paths ldd resolved (build_images.sh stages them), on an empty image: no
# shell, no package manager, nothing a binary does not load.
FROM scratch
COPY . /
