#include "ops/collectives/broadcast.h"

#include "ops/collectives/context.h"

namespace gradcomp {

void Broadcast(Communicator& comm, const BroadcastOptions& o) {
  WithTensorContext("broadcast", o.name, [&] {
    if (o.root < 0 || o.root >= comm.size()) {
      throw InvalidArgument("broadcast root rank " + std::to_string(o.root) + " is outside 0.." +
                            std::to_string(comm.size() - 1));
    }
    comm.Broadcast(o.buffer, o.count * DataTypeSize(o.dtype), o.root);
  });
}

}  // namespace gradcomp
