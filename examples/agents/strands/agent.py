"""A Strands agent trained by Stepwise: its model calls go to the rollout gateway (OpenAI-compatible)."""
from agentcore_rl_toolkit import AgentCoreRLApp
from strands import Agent
from strands.models.openai import OpenAIModel

app = AgentCoreRLApp()


@app.rollout_entrypoint
def invoke_agent(payload):
    ro = payload["_rollout"]
    model = OpenAIModel(
        client_args={"base_url": ro["base_url"].rstrip("/") + "/v1", "api_key": ro["api_key"], "max_retries": 2},
        model_id=ro["model_id"],
        params={"temperature": ro["sampling_params"]["temperature"], "max_tokens": ro["sampling_params"]["max_tokens"]},
    )
    agent = Agent(model=model, system_prompt="Reply with one digit.", callback_handler=None)
    answer = str(agent(payload["prompt"]))
    reward = 1.0 if answer.replace("<|im_end|>", "").strip() == str(payload["answer"]) else 0.0
    return {"rewards": reward, "answer": answer, "framework": "strands"}
