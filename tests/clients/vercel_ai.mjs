// The Vercel AI SDK (ai + @ai-sdk/openai, pinned in package.json) against the ledger, as an app
// uses it: a multi-turn chat (streamText, the messages of each turn appended to the history, the
// way useChat keeps them) and a tool loop (generateText with a tool and several steps). With the
// provider's default store=true it sends every earlier assistant item back as an item_reference.
//
// Usage: node tests/clients/vercel_ai.mjs BASE_URL MODEL
// Prints one JSON object: each turn's text and response id, the tool calls executed, and every
// request body the provider sent (for the test to see the references).
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";

const [baseURL, modelName] = process.argv.slice(2);
const requests = [];
const provider = createOpenAI({
  baseURL,
  apiKey: "test-key",
  fetch: async (url, init) => {
    if (init && typeof init.body === "string") requests.push({ url: String(url), body: JSON.parse(init.body) });
    return fetch(url, init);
  },
});
const model = provider.responses(modelName);

async function chat() {
  const messages = [];
  const turns = [];
  for (const text of ["CHAT-ONE: hello", "CHAT-TWO: and then?", "CHAT-THREE: thanks"]) {
    messages.push({ role: "user", content: text });
    const result = streamText({ model, messages });
    let streamed = "";
    for await (const piece of result.textStream) streamed += piece;
    const response = await result.response;
    messages.push(...response.messages);
    turns.push({ text: streamed, id: response.id, finishReason: await result.finishReason });
  }
  return turns;
}

async function toolLoop() {
  const calls = [];
  const result = await generateText({
    model,
    prompt: "TOOL-LOOP: what is the weather in Paris?",
    stopWhen: stepCountIs(4),
    tools: {
      get_weather: tool({
        description: "The weather in a city.",
        inputSchema: jsonSchema({
          type: "object",
          properties: { city: { type: "string" } },
          required: ["city"],
          additionalProperties: false,
        }),
        execute: async ({ city }) => {
          calls.push(city);
          return { city, sky: "sunny", celsius: 21 };
        },
      }),
    },
  });
  return {
    text: result.text,
    calls,
    steps: result.steps.map((step) => ({ id: step.response.id, finishReason: step.finishReason })),
  };
}

const out = { chat: await chat(), tools: await toolLoop(), requests };
process.stdout.write(JSON.stringify(out));
