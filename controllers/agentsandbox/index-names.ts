// Names shared by the agent-sandbox controllers (no imports: index.ts and the reconcilers use them).

/** Index of the shared fluxvm.dev Sandbox informer: the uid of a Sandbox's controller owner. */
export const OWNER_INDEX = 'agentsandbox-controller-uid';
