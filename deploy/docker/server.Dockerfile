# A shardopt shard server. shardoptctl is here for the health check
# (`shardoptctl health --servers=127.0.0.1:50051`), and for `docker exec`
# status/inspect/checkpoint calls. The server handles SIGTERM itself
# (sigwait), so it runs as PID 1 without an init.
ARG TAG=latest
FROM shardopt-runtime:${TAG}
COPY shardopt_server shardoptctl /usr/local/bin/
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/shardopt_server"]
CMD ["--listen=0.0.0.0:50051", "--device=cpu"]
