package auth

import (
	pb "github.com/pstrain/pstrain/proto"
)

// Allow says whether id may call method (a gRPC full method name) with
// req: Init, SetMembership, Checkpoint, Stop, Promote, SetStandby and
// LoadRows are the chief's alone; a worker pulls, pushes (parameters and
// embedding rows) and heartbeats only as itself; the chief pulls as the
// reader -1 (its evaluations); Replicate
// comes only from the other process of the same shard (AllowReplicate);
// Status answers any task of the run. Registration is not a session call
// (see VerifyRegister); any other method is refused.
func Allow(id Identity, method string, req any) error {
	switch method {
	case pb.ParameterServer_Init_FullMethodName, pb.ParameterServer_SetMembership_FullMethodName,
		pb.ParameterServer_Checkpoint_FullMethodName, pb.ParameterServer_Stop_FullMethodName,
		pb.ParameterServer_Promote_FullMethodName, pb.ParameterServer_SetStandby_FullMethodName,
		pb.ParameterServer_LoadRows_FullMethodName:
		if id.Role != RoleChief {
			return refuse(ReasonForbidden, "%s may not call %s: only the chief may", id.Task(), method)
		}
		return nil
	case pb.ParameterServer_Replicate_FullMethodName:
		r, ok := req.(*pb.ReplicaBatch)
		if !ok || r == nil {
			return refuse(ReasonForbidden, "%s: %s without a replication batch", id.Task(), method)
		}
		return AllowReplicate(id, r.GetShard())
	case pb.ParameterServer_Status_FullMethodName:
		return nil
	case pb.ParameterServer_Pull_FullMethodName:
		r, _ := req.(*pb.PullRequest)
		return AllowPull(id, r.GetWorker(), r.GetRetain())
	case pb.ParameterServer_Push_FullMethodName:
		r, _ := req.(*pb.PushRequest)
		return AllowPush(id, r.GetWorker())
	case pb.ParameterServer_PullRows_FullMethodName:
		r, _ := req.(*pb.PullRowsRequest)
		return AllowPull(id, r.GetWorker(), false)
	case pb.ParameterServer_PushRows_FullMethodName:
		r, _ := req.(*pb.PushRowsRequest)
		return AllowPush(id, r.GetWorker())
	case pb.Chief_Heartbeat_FullMethodName:
		r, _ := req.(*pb.HeartbeatRequest)
		return asWorker(id, r.GetWorker(), "heartbeat")
	}
	return refuse(ReasonForbidden, "%s may not call %s", id.Task(), method)
}

// AllowPull says whether id may pull as reader worker: a worker as
// itself, the chief as -1. Only the chief's pulls may retain the version
// they read (its evaluations: the model a target stop hands back is the
// retained one, so no worker may replace it).
func AllowPull(id Identity, worker int32, retain bool) error {
	if id.Role == RoleChief && worker == -1 {
		return nil
	}
	if retain {
		return refuse(ReasonForbidden, "%s may not retain a version: only the chief's evaluations do", id.Task())
	}
	return asWorker(id, worker, "pull")
}

// AllowReplicate says whether id may send shard's replication batches:
// only a PS process of that shard, ps/N or standby/N (either may be the
// primary: the chief decides), never a worker, the chief, or another
// shard's process.
func AllowReplicate(id Identity, shard int32) error {
	if (id.Role != RolePS && id.Role != RoleStandby) || int64(id.Index) != int64(shard) {
		return refuse(ReasonForbidden, "%s may not replicate shard %d: only ps/%d or standby/%d may", id.Task(), shard, shard, shard)
	}
	return nil
}

// AllowPush says whether id may push as worker: only that worker.
func AllowPush(id Identity, worker int32) error { return asWorker(id, worker, "push") }

func asWorker(id Identity, worker int32, op string) error {
	if id.Role != RoleWorker || int64(id.Index) != int64(worker) {
		return refuse(ReasonForbidden, "%s may not %s as worker %d", id.Task(), op, worker)
	}
	return nil
}

// CheckCertificate binds a mutual-TLS peer to the identity it claims:
// name is the common name of its verified certificate ("" when the
// connection has no TLS, which binds nothing).
func CheckCertificate(name string, id Identity) error {
	if name == "" || name == id.CertName() {
		return nil
	}
	return refuse(ReasonCertificate, "the certificate of %q may not act as %s", name, id.Task())
}
