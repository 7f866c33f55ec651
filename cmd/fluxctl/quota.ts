// The API server's ResourceQuota admission for `fluxctl serve`: the generic counts of every
// namespaced kind plus the Sandbox sums (controllers/quota/usage.ts), charged at this process's
// sandbox defaults (the --default-* flags), which the quota controller then uses too.
import type { KindDefinition } from '../../apis/types.js';
import { quotaEvaluators, setQuotaDefaults } from '../../controllers/quota/index.js';
import type { DefaultLimits } from '../../native/procbox/procbox.js';
import { QuotaAdmission } from '../../runtime/apiserver/admission/quota.js';
import type { Store } from '../../runtime/store/store.js';

export function quotaAdmission(
  store: Store,
  kinds: KindDefinition[],
  defaults?: Partial<DefaultLimits>,
): QuotaAdmission {
  setQuotaDefaults(defaults);
  return new QuotaAdmission(store, kinds, quotaEvaluators());
}
