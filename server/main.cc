// shardopt_server: the optimizer-shard daemon.
//
//   shardopt_server --listen=127.0.0.1:50051 --shard_index=0 --shard_count=2
//
// Flags and behaviour: server/server_main.h and the README.
#include "server/server_main.h"

int main(int argc, char** argv) { return shardopt::RunShardServer(argc, argv); }
