-- Argo CD health check for KubeRay's RayCluster (ray.io/v1), for the chart's Ray layout.
-- Install it under the argocd-cm key `resource.customizations.health.ray.io_RayCluster`.
-- Without it Argo CD has no health for a RayCluster and calls the release Healthy as soon as
-- the object exists. Healthy needs the head Pod Ready (its readiness is the engine's: the
-- model serves) and every desired worker ready, both for the current generation.
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function said(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return fallback .. ": " .. c.message
  end
  return fallback
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for KubeRay to report the RayCluster"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for KubeRay to observe generation " .. tostring(generation)
  return hs
end

local failure = condition("ReplicaFailure")
if failure ~= nil and failure.status == "True" then
  hs.status = "Degraded"
  hs.message = said(failure, "A Ray Pod could not be created or deleted")
  return hs
end

local suspended = condition("RayClusterSuspended")
if suspended ~= nil and suspended.status == "True" then
  hs.status = "Suspended"
  hs.message = "The RayCluster is suspended (spec.suspend)"
  return hs
end

local suspending = condition("RayClusterSuspending")
if suspending ~= nil and suspending.status == "True" then
  hs.status = "Progressing"
  hs.message = "The RayCluster is suspending"
  return hs
end

local head = condition("HeadPodReady")
if head == nil or head.status ~= "True" then
  hs.status = "Progressing"
  hs.message = said(head, "Waiting for the head Pod to be Ready (the engine serving the model)")
  return hs
end

local desired = obj.status.desiredWorkerReplicas or 0
local ready = obj.status.readyWorkerReplicas or 0
if ready < desired then
  hs.status = "Progressing"
  hs.message = "Waiting for workers: " .. tostring(ready) .. " of " .. tostring(desired) .. " ready"
  return hs
end

hs.status = "Healthy"
hs.message = "Head Pod Ready, " .. tostring(ready) .. " of " .. tostring(desired) .. " workers ready"
return hs
