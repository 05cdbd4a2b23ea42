/* distgraph: distributed dataflow graphs in C. The one header users include.
 * Conventions: objects are opaque and made with dg_<type>_new, released with
 * dg_<type>_free(&p) (NULL-safe); fallible calls take a dg_status * last; header comments
 * state who owns a returned pointer ("Returns: new ..." / "Returns: borrowed ..."). */
#ifndef DISTGRAPH_DISTGRAPH_H
#define DISTGRAPH_DISTGRAPH_H

#include "distgraph/version.h"
#include "distgraph/status.h"
#include "distgraph/tensor.h"
#include "distgraph/graph.h"
#include "distgraph/ops.h"
#include "distgraph/train.h"
#include "distgraph/strategy.h"
#include "distgraph/session.h"
#include "distgraph/device_name.h"
#include "distgraph/cluster.h"
#include "distgraph/device_setter.h"
#include "distgraph/placer.h"
#include "distgraph/serialize.h"
#include "distgraph/server.h"
#include "distgraph/checkpoint.h"
#include "distgraph/monitored_session.h"
#include "distgraph/sync_replicas.h"
#include "distgraph/collective.h"

#endif
