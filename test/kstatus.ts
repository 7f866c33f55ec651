// A small kstatus checker of our own: the published generic rules of
// sigs.k8s.io/cli-utils pkg/kstatus/status (the ones Flux and Argo CD apply to custom
// resources), in the order kstatus applies them:
//   1. metadata.deletionTimestamp set                        -> InProgress (kstatus: Terminating)
//   2. status.observedGeneration present and != generation   -> InProgress (the latest spec is not seen)
//   3. condition Reconciling=True                            -> InProgress
//   4. condition Stalled=True                                -> Failed
//   5. otherwise                                             -> Current
// kstatus also reads a Ready condition only for some built-in kinds; for custom resources it
// does not, so a controller that wants "not yet" to show must say Reconciling (ours do).
export type KStatus = 'Current' | 'InProgress' | 'Failed';

interface Obj {
  metadata: { generation?: number; deletionTimestamp?: string };
  status?: { observedGeneration?: number; conditions?: Array<{ type: string; status: string; reason?: string }> };
}

export function kstatus(o: Obj): { status: KStatus; reason?: string } {
  if (o.metadata.deletionTimestamp) return { status: 'InProgress', reason: 'Terminating' };
  const og = o.status?.observedGeneration;
  if (og !== undefined && o.metadata.generation !== undefined && og !== o.metadata.generation)
    return { status: 'InProgress', reason: 'LatestGenerationNotObserved' };
  const cond = (t: string) => o.status?.conditions?.find((c) => c.type === t && c.status === 'True');
  const rec = cond('Reconciling');
  if (rec) return { status: 'InProgress', reason: rec.reason };
  const st = cond('Stalled');
  if (st) return { status: 'Failed', reason: st.reason };
  return { status: 'Current' };
}
