// A Sandbox-like schema exercising every kind of node field management cares about.
import type { Schema } from '../../../../apis/types.js';
import type { KubeObject } from '../../../../runtime/meta/types.js';
import type { AnyObject } from '../../../support/objects.js';

export const AV = 'fluxvm.dev/v1alpha1';

export const schema: Schema = {
  type: 'object',
  properties: {
    apiVersion: { type: 'string' },
    kind: { type: 'string' },
    metadata: { type: 'object' },
    spec: {
      type: 'object',
      properties: {
        image: { type: 'string' },
        runtime: { type: 'string' },
        paused: { type: 'boolean' },
        ttlSeconds: { type: 'integer' },
        command: { type: 'array', items: { type: 'string' } },
        tags: { type: 'array', items: { type: 'string' }, 'x-kubernetes-list-type': 'set' },
        env: { type: 'object', additionalProperties: { type: 'string' } },
        resources: {
          type: 'object',
          'x-kubernetes-map-type': 'atomic',
          properties: { cpu: { type: 'string' }, memory: { type: 'string' } },
        },
        network: {
          type: 'object',
          properties: {
            mode: { type: 'string' },
            allow: { type: 'array', items: { type: 'string' }, 'x-kubernetes-list-type': 'set' },
          },
        },
        ports: {
          type: 'array',
          'x-kubernetes-list-type': 'map',
          'x-kubernetes-list-map-keys': ['port', 'protocol'],
          items: {
            type: 'object',
            properties: {
              port: { type: 'integer' },
              protocol: { type: 'string', default: 'TCP' },
              name: { type: 'string' },
            },
          },
        },
        extra: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
      },
    },
    status: {
      type: 'object',
      properties: {
        phase: { type: 'string' },
        conditions: {
          type: 'array',
          'x-kubernetes-list-type': 'map',
          'x-kubernetes-list-map-keys': ['type'],
          items: {
            type: 'object',
            properties: {
              type: { type: 'string' },
              status: { type: 'string' },
              reason: { type: 'string' },
              message: { type: 'string' },
            },
          },
        },
      },
    },
  },
};

export function sbx(
  spec: Record<string, unknown> = {},
  meta: Record<string, unknown> = {},
  status?: Record<string, unknown>,
): AnyObject {
  return {
    apiVersion: AV,
    kind: 'Sandbox',
    metadata: { name: 'demo', namespace: 'default', ...meta },
    spec,
    ...(status ? { status } : {}),
  };
}

/** What the registry adds on create; field management must leave these alone. */
export function stored(obj: KubeObject): AnyObject {
  return {
    ...obj,
    metadata: {
      ...obj.metadata,
      uid: 'u-1',
      resourceVersion: '7',
      generation: 1,
      creationTimestamp: '2026-01-01T00:00:00Z',
    },
  };
}

export const T0 = '2026-01-01T00:00:00Z';
export const T1 = '2026-01-01T00:01:00Z';
export const T2 = '2026-01-01T00:02:00Z';
export const T3 = '2026-01-01T00:03:00Z';
