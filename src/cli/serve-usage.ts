/** The `meshwork serve` flags, for `--help` (src/config.ts reads them). */
export const serveUsage = `Usage: meshwork serve [flags]

  --listen HOST:PORT        MESHWORK_LISTEN       default 127.0.0.1:8080
  --data-dir DIR            MESHWORK_DATA_DIR     default ./.meshwork
  --database-url URL        DATABASE_URL          PostgreSQL; unset = embedded PGlite
  --db-pool-size N          MESHWORK_DB_POOL_SIZE        PostgreSQL request connections; default 10
  --db-acquire-timeout MS   MESHWORK_DB_ACQUIRE_TIMEOUT  wait for a free one, then unavailable; default 3000
  --db-statement-timeout MS MESHWORK_DB_STATEMENT_TIMEOUT  statement_timeout; default 30000, 0 = none
  --public-url URL          MESHWORK_PUBLIC_URL   base of artifact URIs; default http://<listen>
  --auth on|off             MESHWORK_AUTH         bearer tokens; default on (off only on loopback)
  --blob-dir DIR            MESHWORK_BLOB_DIR     default <data dir>/blobs
  --blob-store fs|postgres|s3://BUCKET/PREFIX
                            MESHWORK_BLOB_STORE   where artifact bytes live; default fs (--blob-dir)
  --log-level LEVEL         MESHWORK_LOG_LEVEL    trace|debug|info|warn|error|silent; default info
  --log-format auto|json|pretty
                            MESHWORK_LOG_FORMAT   default auto: pretty on a terminal, JSON lines otherwise
  --metrics-public on|off   MESHWORK_METRICS_PUBLIC  GET /metrics without a token; default off
  --vacuum on|off           MESHWORK_VACUUM       vacuum its own tables when dead rows pile up; default on
  --otel-endpoint URL       OTEL_EXPORTER_OTLP_ENDPOINT  export spans over OTLP/HTTP; default none
  --heartbeat-interval S    MESHWORK_HEARTBEAT_INTERVAL  seconds, default 15
  --dispatch-default on|off MESHWORK_DISPATCH_DEFAULT  deliver pushed tasks that do not say; default off
  --dispatch-workloads W,.. MESHWORK_DISPATCH_WORKLOADS deliver those workloads' pushed tasks that do not say
  --dispatch-timeout S      MESHWORK_DISPATCH_TIMEOUT  one delivery request's time; default 10
  --dispatch-concurrency N  MESHWORK_DISPATCH_CONCURRENCY  delivery requests in flight; default 16
  --dispatch-allow CIDR,... MESHWORK_DISPATCH_ALLOW  private targets allowed; default 127.0.0.0/8,::1 ("none")
  --retention DURATION      MESHWORK_RETENTION    delete finished tasks this old (30m, 12h, 7d); default 7d, 0 = never
  --worker-retention DURATION  MESHWORK_WORKER_RETENTION  remove workers LOST this long; default 24h, 0 = never
  --read-max-bytes N        MESHWORK_READ_MAX_BYTES      default 4194304
  --max-artifact-bytes N    MESHWORK_MAX_ARTIFACT_BYTES  default 1073741824
  --tls-cert FILE           MESHWORK_TLS_CERT     PEM certificate: serve TLS (ALPN h2, http/1.1)
  --tls-key FILE            MESHWORK_TLS_KEY      PEM private key of --tls-cert

Limits (each refusal is a clear error and changes nothing):
  --rate-limit N            MESHWORK_RATE_LIMIT          requests/s per token; default 0 (off)
  --rate-burst N            MESHWORK_RATE_BURST          burst per token; default 2 × --rate-limit
  --rate-limit-admin on|off MESHWORK_RATE_LIMIT_ADMIN    limit admin tokens too; default off
  --max-timeout S           MESHWORK_MAX_TIMEOUT         longest client deadline, seconds; default 300
  --headers-timeout S       MESHWORK_HEADERS_TIMEOUT     HTTP/1.1 request headers, seconds; default 10
  --request-timeout S       MESHWORK_REQUEST_TIMEOUT     HTTP/1.1 whole request, seconds; default 600
  --idle-timeout S          MESHWORK_IDLE_TIMEOUT        idle connection or HTTP/2 session, seconds; default 300
  --max-concurrent-streams N MESHWORK_MAX_CONCURRENT_STREAMS  HTTP/2 streams per session; default 100
  --max-header-bytes N      MESHWORK_MAX_HEADER_BYTES    request header block; default 16384
  --max-connections-per-source N MESHWORK_MAX_CONNECTIONS_PER_SOURCE
                            open connections per address (IPv6: per /64); default 256, 0 = no limit
  --body-timeout S          MESHWORK_BODY_TIMEOUT        a body that stops for this long ends (408 / RST_STREAM); default 30
  --auth-failure-rate N     MESHWORK_AUTH_FAILURE_RATE   failed authentications/s per address, then 429; default 10, 0 = off
  --auth-failure-burst N    MESHWORK_AUTH_FAILURE_BURST  burst of the above; default 100
  --max-pending-auth-bytes N MESHWORK_MAX_PENDING_AUTH_BYTES
                            bytes requests awaiting a token lookup may buffer, in all; default 67108864
  --log-lines-per-task N    MESHWORK_LOG_LINES_PER_TASK   log lines kept per task, oldest dropped; default 10000
  --log-lines-per-second N  MESHWORK_LOG_LINES_PER_SECOND log lines/s per task, then dropped; default 1000, 0 = off

Scheduling (docs/scheduling.md):
  --default-share token|PATH MESHWORK_DEFAULT_SHARE  share of a task that names none; default token (its token's name)
  --share-half-life DURATION MESHWORK_SHARE_HALF_LIFE half-life of a share's usage; default 5m
  --reserve-after DURATION  MESHWORK_RESERVE_AFTER   reserve a worker for a large task waiting this long; default 30s, 0 = never
  --keda-listen HOST:PORT   MESHWORK_KEDA_LISTEN     KEDA external-scaler gRPC listener, read-only demand; default off
  --keda-client-ca FILE     MESHWORK_KEDA_CLIENT_CA  require client certificates signed by this CA (needs --tls-cert)
`;
