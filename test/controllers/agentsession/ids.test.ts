import { expect } from 'chai';
import { checkpointRuntimeId } from '../../../controllers/agentsession/reconciler.js';

describe('agentsession checkpoint runtime ids', () => {
  const s = { metadata: { uid: '7e439d0c-3871-4651-9f74-dd2605af993d' } } as any;
  const ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/; // the vm runtime's (the stricter backend)

  it('short names keep the readable form; long ones are hashed; every id fits 63 characters and is distinct', () => {
    expect(checkpointRuntimeId(s, 'cp-1')).to.equal('ags-7e439d0c-3871-4651-9f74-dd2605af993d-cp-1');
    const names = [
      'a',
      'x'.repeat(22),
      'x'.repeat(23),
      'pre-promote-v1-1-1796135953434',
      'pre-promote-v1-2-1796135953434',
      'y'.repeat(63),
    ];
    const ids = names.map((n) => checkpointRuntimeId(s, n));
    for (const id of ids) expect(id, id).to.match(ID_RE);
    expect(new Set(ids).size).to.equal(names.length);
    expect(checkpointRuntimeId(s, 'x'.repeat(22))).to.have.length(63);
    expect(checkpointRuntimeId(s, names[3]!)).to.equal(checkpointRuntimeId(s, names[3]!));
  });
});
