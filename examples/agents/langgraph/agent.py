"""A LangGraph agent (LangChain 1.x create_agent) trained by Stepwise: its model calls go to the rollout gateway."""
from agentcore_rl_toolkit import AgentCoreRLApp
from langchain.agents import create_agent
from langchain_openai import ChatOpenAI

app = AgentCoreRLApp()


@app.rollout_entrypoint
def invoke_agent(payload):
    ro = payload["_rollout"]
    llm = ChatOpenAI(model=ro["model_id"], base_url=ro["base_url"].rstrip("/") + "/v1", api_key=ro["api_key"],
                     temperature=ro["sampling_params"]["temperature"], max_tokens=ro["sampling_params"]["max_tokens"],
                     max_retries=2)
    graph = create_agent(llm, tools=[], system_prompt="Reply with one digit.")
    result = graph.invoke({"messages": [{"role": "user", "content": payload["prompt"]}]})
    answer = str(result["messages"][-1].content)
    reward = 1.0 if answer.replace("<|im_end|>", "").strip() == str(payload["answer"]) else 0.0
    return {"rewards": reward, "answer": answer, "framework": "langgraph"}
