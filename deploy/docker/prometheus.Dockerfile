# Prometheus for docker-compose.monitoring.yml: Debian's prometheus binary
# (its libraries are in the runtime image) and its web UI's files, which
# the Debian build reads from /usr/share/prometheus/web. It runs as PID 1
# and handles SIGTERM itself.
ARG TAG=latest
FROM shardopt-runtime:${TAG}
COPY prometheus /usr/local/bin/
COPY web /usr/share/prometheus/web
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
