export const meta = {
  name: 'review-diff',
  description: 'Review the changed files along several dimensions, then verify each finding',
  phases: [{ title: 'Review' }, { title: 'Verify' }, { title: 'Report' }],
}

// The files under review: the resident passes them, or the script reviews its defaults.
const FILES = (args && args.files) || ['src/calc.py', 'src/parse.py']

const FINDINGS = {
  type: 'object',
  properties: {
    findings: {
      type: 'array',
      items: {
        type: 'object',
        properties: {
          title: { type: 'string' },
          severity: { enum: ['low', 'medium', 'high'] },
          line: { type: 'integer', minimum: 1, maximum: 40 },
        },
        required: ['title', 'severity'],
      },
    },
    seen: { type: 'string' },
  },
  required: ['findings'],
}

const VERDICT = {
  type: 'object',
  properties: {
    isReal: { type: 'boolean' },
    reason: { type: 'string' },
  },
  required: ['isReal'],
}

const DIMENSIONS = [
  { key: 'correctness', ask: 'Find correctness bugs (wrong results, crashes) in' },
  { key: 'robustness', ask: 'Find inputs that are not handled (empty, zero, negative) in' },
]

function reviewPrompt(dim, file) {
  return `${dim.ask} ${file}. Report each finding with its severity and line.`
}

phase('Review')
const reviews = await parallel(
  DIMENSIONS.flatMap((dim) =>
    FILES.map((file) => () =>
      agent(reviewPrompt(dim, file), { label: `review:${dim.key}:${file}`, schema: FINDINGS })
        .then((r) => ({ dim: dim.key, file, findings: r ? r.findings : [], seen: r ? r.seen : null })),
    ),
  ),
)

const all = reviews.filter(Boolean).flatMap((r) =>
  r.findings.map((f, i) => ({ ...f, file: r.file, dim: r.dim, id: `${r.dim}-${r.file}-${i}` })),
)
log(`review: ${all.length} findings in ${FILES.length} files`)

// Only the serious findings are worth an adversarial check.
const serious = all.filter((f) => f.severity !== 'low').slice(0, 3)

phase('Verify')
const verified = await parallel(
  serious.map((f) => () =>
    agent(`Adversarially verify "${f.title}" in ${f.file}: is it a real bug?`, {
      label: `verify:${f.id}`,
      schema: VERDICT,
    }).then((v) => ({ ...f, verdict: v })),
  ),
)

const confirmed = verified.filter(Boolean).filter((f) => f.verdict && f.verdict.isReal)

phase('Report')
const summary = confirmed.length
  ? await agent(
      `Write a two-line review summary of these confirmed findings: ${confirmed.map((f) => f.title).join('; ')}`,
      { label: 'summary' },
    )
  : 'nothing confirmed'

return {
  files: FILES,
  total: all.length,
  serious: serious.length,
  confirmed: confirmed.map((f) => ({ id: f.id, severity: f.severity })),
  seen: reviews.filter(Boolean).map((r) => r.seen),
  summary,
}
