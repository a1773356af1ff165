#!/usr/bin/env node
// Generates types/api.d.ts from the API's OpenAPI document, so that tsc checks the pages'
// JavaScript against the shapes the API really serves.
//
//   node tools/gen-api-types.mjs SOURCE [--check]
//
// SOURCE is a file or an http(s) URL of /api/openapi.json. Without --check the file is
// written; with --check nothing is written and the exit status is 1 when the committed file
// differs from what the document gives (CI: an API change must come with its types).
import { readFile, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const target = path.join(here, '..', 'types', 'api.d.ts');

/** @param {string} source */
async function load(source) {
  if (/^https?:\/\//.test(source)) {
    const res = await fetch(source);
    if (!res.ok) throw new Error(`${source} answered ${res.status}`);
    return res.json();
  }
  return JSON.parse(await readFile(source, 'utf8'));
}

const IDENT = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/** @param {string} text @param {string} indent */
function doc(text, indent) {
  if (!text) return '';
  const lines = text.replace(/\*\//g, '*\\/').split('\n');
  if (lines.length === 1) return `${indent}/** ${lines[0]} */\n`;
  return `${indent}/**\n${lines.map((l) => `${indent} * ${l}`.trimEnd()).join('\n')}\n${indent} */\n`;
}

/**
 * The TypeScript type of a schema.
 * @param {any} schema
 * @param {string} indent
 * @returns {string}
 */
function ty(schema, indent) {
  if (schema === true || schema === undefined || schema === null) return 'unknown';
  if (schema.$ref) return schema.$ref.replace('#/components/schemas/', '');
  if (schema.oneOf || schema.anyOf) {
    const parts = (schema.oneOf ?? schema.anyOf).map((/** @type {any} */ s) => ty(s, indent));
    return [...new Set(parts)].join(' | ');
  }
  if (schema.allOf) {
    return schema.allOf.map((/** @type {any} */ s) => wrap(ty(s, indent))).join(' & ');
  }
  if (schema.enum) {
    return schema.enum.map((/** @type {unknown} */ v) => JSON.stringify(v)).join(' | ');
  }
  if (Array.isArray(schema.type)) {
    return schema.type.map((/** @type {string} */ t) => wrap(ty({ ...schema, type: t }, indent))).join(' | ');
  }
  switch (schema.type) {
    case 'string':
      return 'string';
    case 'integer':
    case 'number':
      return 'number';
    case 'boolean':
      return 'boolean';
    case 'null':
      return 'null';
    case 'array':
      return `Array<${ty(schema.items, indent)}>`;
    case 'object':
    case undefined:
      if (schema.properties) return object(schema, indent);
      if (schema.additionalProperties && schema.additionalProperties !== true) {
        return `Record<string, ${ty(schema.additionalProperties, indent)}>`;
      }
      return schema.type === 'object' ? 'Record<string, unknown>' : 'unknown';
    default:
      return 'unknown';
  }
}

/** @param {string} t */
function wrap(t) {
  return /[|&]/.test(t) && !t.startsWith('{') ? `(${t})` : t;
}

/** @param {any} schema @param {string} indent */
function object(schema, indent) {
  const required = new Set(schema.required ?? []);
  const inner = indent + '  ';
  let out = '{\n';
  for (const [name, prop] of Object.entries(schema.properties)) {
    const key = IDENT.test(name) ? name : JSON.stringify(name);
    const description = /** @type {any} */ (prop).description ?? '';
    out += doc(description, inner);
    out += `${inner}${key}${required.has(name) ? '' : '?'}: ${ty(prop, inner)};\n`;
  }
  return out + indent + '}';
}

/** @param {any} openapi */
export function generate(openapi) {
  const schemas = openapi.components?.schemas ?? {};
  let out =
    '// Generated from the API\'s OpenAPI document (GET /api/openapi.json) by\n' +
    '// tools/gen-api-types.mjs. Do not edit: regenerate (see docs/frontend.md).\n';
  for (const name of Object.keys(schemas).sort()) {
    const schema = schemas[name];
    out += '\n' + doc(schema.description ?? '', '');
    if (schema.properties && !schema.allOf && !schema.oneOf) {
      out += `export interface ${name} ${object(schema, '')}\n`;
    } else {
      out += `export type ${name} = ${ty(schema, '')};\n`;
    }
  }
  return out;
}

async function main() {
  const args = process.argv.slice(2);
  const check = args.includes('--check');
  const source = args.find((a) => !a.startsWith('--'));
  if (!source) {
    console.error('usage: gen-api-types.mjs SOURCE [--check]');
    process.exit(2);
  }
  const text = generate(await load(source));
  if (check) {
    const current = await readFile(target, 'utf8').catch(() => '');
    if (current !== text) {
      console.error(
        'types/api.d.ts differs from the API\'s OpenAPI document: regenerate it with ' +
          '`node tools/gen-api-types.mjs <url of /api/openapi.json>` and commit it.',
      );
      process.exit(1);
    }
    console.log('types/api.d.ts matches the API');
  } else {
    await writeFile(target, text);
    console.log(`wrote ${path.relative(process.cwd(), target)}`);
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((e) => {
    console.error(e instanceof Error ? e.message : e);
    process.exit(1);
  });
}
